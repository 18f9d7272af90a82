"""`train.py --elastic POLICY`: the same training loop under torchrun, with the state in
the per-host store daemons (python/tenplex/elastic.py, docs/deploy.md).

    TENPLEX_STORE_URL=http://127.0.0.1:7480 .venv/bin/torchrun \\
        --nnodes=1:3 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=HOST0:29400 \\
        examples/gpt/train.py --elastic policy.json --job gpt --model gpt.json --steps 100 \\
        --commit-every 10

The config comes from the policy for torchrun's WORLD_SIZE; --steps is the job's last
step (a restarted worker goes on from the committed step); --commit-every N commits the
state every N steps; a SIGTERM from torchrun's agent commits at the next step boundary.
Each step's line in --log is the same as under `tenplex run` (steps re-run after a
failure appear again; the last line counts).
"""

import os
import time

import torch.distributed as dist

from tenplex import checkpoint, elastic
from tenplex import layout as L


def add_args(ap):
    g = ap.add_argument_group("elastic (under torchrun)")
    g.add_argument(
        "--elastic",
        metavar="POLICY",
        help="run under torchrun: POLICY maps world sizes to configs "
        '(a JSON file or text, {"4": "tp=2,pp=2", "2": "tp=2"}); --steps is the job\'s last step',
    )
    g.add_argument("--job", default="gpt", help="job name in the store daemons (with --elastic)")
    g.add_argument("--store-url", help="this host's store daemon (default TENPLEX_STORE_URL)")
    g.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="with --elastic: sleep so that every step takes at least this long (demos, tests)",
    )
    g.add_argument(
        "--disk-checkpoint",
        metavar="DIR",
        help="baseline for benchmarks (what torchrun users do "
        "today): data parallelism only, the state saved by rank 0 into DIR/step-N on a shared disk and read "
        "back by every rank at a restart, instead of the store daemons",
    )
    g.add_argument(
        "--async-commit",
        action="store_true",
        help="with --elastic and --commit-every: write the "
        "periodic commits in the background while training goes on (tenplex.elastic.Job(async_commit))",
    )
    g.add_argument(
        "--term-wait",
        type=float,
        default=15.0,
        help="with --elastic: seconds to wait for torchrun's "
        "SIGTERM after stopping for a membership change (then exit 3: a new rendezvous)",
    )


class DiskJob(elastic.Job):
    """The baseline: a DP-only job whose rank 0 writes the (replicated) state into a
    checkpoint directory; every rank of a restarted world reads that one file."""

    def __init__(self, directory, *a, **kw):
        super().__init__(*a, **kw)
        self.directory = directory
        cfg = L.Config.parse(self.config)
        if cfg.tp != 1 or cfg.pp != 1 or getattr(cfg, "zero", 0):
            raise elastic.ElasticError(f"--disk-checkpoint is data parallelism only, the policy gives {self.config}")

    def restore(self, device=None):
        """(`device` is left to the trainer: the checkpoint's tensors are read on the host.)"""
        t0, age = time.perf_counter(), elastic.process_age()
        self.hosts = []
        latest = os.path.join(self.directory, "latest")
        if not os.path.exists(latest):
            self._log_event(
                {
                    "event": "elastic_start",
                    "world_size": self.world_size,
                    "config": self.config,
                    "version": None,
                    "process_seconds": round(age, 3),
                }
            )
            return None
        with open(latest) as f:
            d = f.read().strip()
        info = dict(checkpoint.read_info(d), config=self.config)
        tensors = checkpoint.read_rank(d, 0)  # every data-parallel rank holds the same state
        load_s = time.perf_counter() - t0
        self._log_event(
            {
                "event": "elastic_start",
                "world_size": self.world_size,
                "config": self.config,
                "step": info.get("step"),
                "transformed": False,
                "transform_seconds": 0.0,
                "gather_seconds": 0.0,
                "load_seconds": round(load_s, 4),
                "process_seconds": round(age, 3),
                "restart_count": self.restart_count,
            }
        )
        return elastic.Restored(None, info, tensors, load_s)

    def commit(self, info, tensors):
        t0 = time.perf_counter()
        d = os.path.join(self.directory, f"step-{info['step']}")
        if self.rank == 0:
            checkpoint.begin(d)
            checkpoint.write_rank(d, 0, list(tensors), {"config": "tp=1"})
            checkpoint.commit(d, dict(info, config="tp=1,pp=1,dp=1"), 1)
            with open(os.path.join(self.directory, "latest.tmp"), "w") as f:
                f.write(d)
            os.replace(os.path.join(self.directory, "latest.tmp"), os.path.join(self.directory, "latest"))
        dist.barrier()
        self._log_event({"event": "commit", "step": info.get("step"), "seconds": round(time.perf_counter() - t0, 4)})


def example_policy(args):
    """--elastic as given, a "suggest:ARGS" policy with what this example implements of
    the knobs fixed (no sequence parallelism or virtual stages; its own batch shape), so
    that the policy searches the rest (recomputation, zero=1)."""
    policy = args.elastic
    if not isinstance(policy, str) or not policy.startswith("suggest:"):
        return policy
    given = policy[len("suggest:") :].split()
    for flag, value in (
        ("--global-batch", args.global_batch_size),
        ("--micro-batch", args.micro_batch_size),
        ("--seq-length", args.seq_length),
        ("--virtual-stages", 1),
    ):
        if flag not in given:
            policy += f" {flag} {value}"
    if "--sequence-parallel" not in given and "--no-sequence-parallel" not in given:
        policy += " --no-sequence-parallel"
    return policy


def apply_knobs(args, knobs):
    """The recomputation of the policy's choice (Megatron-LM arguments), unless the
    command gave its own."""
    if args.recompute_granularity or args.recompute_activations or not knobs:
        return
    for flag, attr, kind in (
        ("--recompute-granularity", "recompute_granularity", str),
        ("--recompute-method", "recompute_method", str),
        ("--recompute-num-layers", "recompute_num_layers", int),
    ):
        if flag in knobs:
            setattr(args, attr, kind(knobs[knobs.index(flag) + 1]))


def check_config(args, model, config):
    """The policy's config for this world, checked against the model and batch."""
    cfg = L.Config.parse(config)
    L.validate(model, cfg)
    if args.global_batch_size < cfg.dp:
        raise ValueError(f"--global-batch-size {args.global_batch_size} is smaller than dp={cfg.dp}")
    return cfg


def main(args, trainer_cls, fail):
    """Runs the elastic loop; `trainer_cls` is train.py's Trainer, `fail` its error exit.
    Under torchrun a membership change ends the process (job.finish(); torchrun restarts
    it); under `python -m tenplex.hostagent` (membership mode) the worker stays: it
    rejoins the next world and restores the state transformed onto it."""
    try:
        kw = dict(
            commit_every=args.commit_every,
            store_url=args.store_url or "http://unused:1",
            term_wait=args.term_wait,
            log=args.log,
        )
        if args.disk_checkpoint:
            job = DiskJob(args.disk_checkpoint, args.job, args.elastic, **kw)
        else:
            kw["store_url"] = args.store_url
            job = elastic.Job(args.job, example_policy(args), async_commit=args.async_commit, **kw)
        if not args.model or not os.path.isfile(args.model):
            raise ValueError("--elastic needs --model (a JSON file from `tenplex model gpt`)")
        model = L.Model.load(args.model)
        if model.optimizer_states != ["exp_avg", "exp_avg_sq"]:
            raise ValueError("the model must have --optimizer adam (its state is exp_avg and exp_avg_sq)")
        if args.load_dir or args.state_in or args.state_out or args.save_dir:
            raise ValueError(
                "--elastic keeps the state in the store daemons: no --load-dir, --state-in/out, --save-dir"
            )
        apply_knobs(args, job.knobs)
        cfg = check_config(args, model, job.config)
    except (ValueError, KeyError, OSError, elastic.ElasticError) as e:
        fail(e)
    args.world_rank, args.world_size, args.start_step = job.rank, job.world_size, None
    job.init_process_group("gloo", timeout=args.timeout)
    try:
        device = trainer_cls.device_of(args)
    except ValueError as e:
        fail(e)
    while True:
        args.world_rank, args.world_size = job.rank, job.world_size
        try:
            stopped = segment(args, job, model, cfg, trainer_cls, device, fail)
        except Exception as e:  # noqa: BLE001 - a lost peer shows as any error of a collective
            if not job.aborted(e):
                raise
            print(f"rank {job.rank}: world aborted (a host was lost): {type(e).__name__}: {str(e)[:200]}", flush=True)
            stopped = True
        if not stopped:
            break
        if not job.membership:
            job.finish()  # exits: torchrun restarts the worker
        job.rejoin()  # exits when the next world has no place for this worker
        try:
            apply_knobs(args, job.knobs)
            cfg = check_config(args, model, job.config)
        except (ValueError, KeyError, elastic.ElasticError) as e:
            fail(e)
    job.close()


def segment(args, job, model, cfg, trainer_cls, device, fail):
    """Restores the state onto this world and trains until the last step (False) or a
    membership change (True)."""
    restored = job.restore(device=device if device.type == "cuda" else None)
    trainer = trainer_cls(args, model, cfg, job.rank)
    if restored is not None:
        try:
            trainer.restore(f"version {restored.version} of job {args.job}", restored.info, lambda: restored.tensors)
        except (ValueError, KeyError) as e:
            fail(f"rank {job.rank}: {e}")
    while trainer.step < args.steps:
        t0 = time.perf_counter()
        step = trainer.step
        loss, norm, ids = trainer.train_step()
        seconds = time.perf_counter() - t0
        if job.rank == 0:
            trainer.log_event(
                {
                    "step": step,
                    "loss": loss,
                    "config": str(cfg),
                    "samples": ids,
                    "grad_norm": norm,
                    "seconds": round(seconds, 4),
                    "world_size": job.world_size,
                }
            )
        if args.min_step_seconds > seconds:
            time.sleep(args.min_step_seconds - seconds)
        if job.step_done(trainer.step, trainer.info, trainer.state_tensors, last=trainer.step == args.steps):
            return True
    return False
