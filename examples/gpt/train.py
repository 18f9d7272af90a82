#!/usr/bin/env python3
"""Reference training client: a Megatron-style GPT on CPU, TP/PP/DP over gloo.

One process per rank:
  train.py --config tp=2,pp=2,dp=2 --model M.json --world-rank R --world-size N --master-port P
           [--steps N] [--load-dir D] [--save-dir D] [--log LOG.jsonl] ...
(`launch.py` starts all ranks of a config on this machine). The model JSON is written
by `tenplex model gpt ...`; the rank's parameters and optimizer state are exactly the
local tensors of spec ptc-layout.md, and --load-dir/--save-dir read and write
checkpoint directories of spec §7. See docs/training.md.
"""

import argparse
import datetime
import json
import os
import sys
import time

import data
import elastic_train
import flextp
import meter
import model as gpt
import optimizer
import parallel
import torch
import torch.distributed as dist
import uneven

from tenplex import _tenplex, checkpoint, handoff, warm
from tenplex import layout as L

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT_CORPUS = os.path.join(HERE, "data", "corpus.jsonl")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="tp=2,pp=2,dp=2[,zero=1][,layers=a+b] (required without --elastic)")
    ap.add_argument("--model", help="model JSON from `tenplex model gpt` (default: the one in --load-dir)")
    ap.add_argument("--world-rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=29500)
    ap.add_argument("--steps", type=int, default=5, help="steps to run in this invocation")
    ap.add_argument(
        "--start-step",
        type=int,
        help="first step when not loading state (default 0); with --load-dir/--state-in it must match the state's step",
    )
    ap.add_argument("--global-batch-size", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-length", type=int, default=64)
    ap.add_argument("--data", default=DEFAULT_CORPUS, help="JSONL corpus, one sample per line")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip-grad", type=float, default=1.0, help="global gradient norm limit (0: off)")
    ap.add_argument("--load-dir")
    ap.add_argument("--save-dir", help="write a checkpoint directory (spec §7) after the last step")
    ap.add_argument(
        "--save-at", type=int, help="write --save-dir when this many steps are done instead (training goes on)"
    )
    # --step-log: the spelling for torchrun, whose argparse (Python 3.11) rejects a script
    # argument that is an ambiguous prefix of its own options (--log: --log-dir, --logs-specs).
    ap.add_argument(
        "--log",
        "--step-log",
        dest="log",
        help="append one JSON line per completed step (rank 0), "
        'and {"event": "checkpoint" or "commit", "step", "seconds"} per state save',
    )
    ap.add_argument("--state-in", help="hand-off JSON of `tenplex run`: load state from store files")
    ap.add_argument("--state-out", help="hand-off JSON of `tenplex run`: write the final state into store files")
    ap.add_argument(
        "--commit-every",
        type=int,
        default=0,
        help="with `tenplex run --commit-every`: also write "
        "the state every N steps into <commit-prefix><step>.json and train on",
    )
    ap.add_argument("--commit-prefix", help="hand-off file prefix of the periodic commits")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the model and optimizer state live: cuda is cuda:<local rank %% GPUs>; state "
        "loads and commits go between the store and the device (tenplex.device); collectives "
        "stay on gloo, through host memory",
    )
    ap.add_argument("--timeout", type=float, default=300, help="seconds a collective may wait")
    ap.add_argument(
        "--warm-control",
        metavar="PREFIX",
        help="with `tenplex run --warm`: after each segment "
        "wait for the runner's next message <PREFIX><n>.json and go on in the same process",
    )
    ap.add_argument(
        "--warm-spare",
        action="store_true",
        help="with --warm-control: started ahead, wait for the first segment's arguments",
    )
    ap.add_argument(
        "--no-warm-keep",
        action="store_true",
        help="with --warm-control: do not keep the state "
        "written at a stop for the next load (by default the tensors the plan leaves unchanged are "
        "reused on their device instead of read from the store; they stay allocated while parked)",
    )
    elastic_train.add_args(ap)
    ap.add_argument(
        "--flextp-straggler",
        type=int,
        metavar="T",
        help="FlexTP-style per-step offload (flextp.py): tp rank T keeps 12.5%% of the input "
        "columns of its layer linears, the other tp ranks compute the rest every step",
    )
    # Megatron-LM's activation recomputation (model.Recompute; docs/training.md).
    ap.add_argument(
        "--recompute-granularity",
        choices=["full", "selective"],
        help="recompute activations in the backward: whole layers (full) or the attention core "
        "of every layer (selective); default: store all activations",
    )
    ap.add_argument(
        "--recompute-method",
        choices=["uniform", "block"],
        help="with full: checkpoint groups of --recompute-num-layers consecutive local layers "
        "(uniform, the default) or only the first --recompute-num-layers layers of the stage (block)",
    )
    ap.add_argument(
        "--recompute-num-layers",
        type=int,
        metavar="N",
        help="with full: layers per group (uniform) or recomputed layers per stage (block); default 1",
    )
    ap.add_argument(
        "--recompute-activations",
        action="store_true",
        help="Megatron's older spelling of --recompute-granularity selective",
    )
    ap.add_argument(
        "--slowdown",
        action="append",
        metavar="RANK=FACTOR",
        help="emulate a slow device: that rank's own compute takes FACTOR times as long "
        "(sleeps (FACTOR-1) x its measured compute; docs/hetero.md); repeatable, or 1=2,3=1.5",
    )
    return ap.parse_args(argv)


class Trainer:
    """The rank's model stage, optimizer and position; state in and out as local tensors."""

    def __init__(self, args, model, cfg, rank):
        self.args, self.model, self.cfg, self.rank = args, model, cfg, rank
        self.device = self.device_of(args)
        hp = gpt.HParams(model.info)
        # Warm workers re-join a world at every reconfiguration: their groups skip
        # torch's world-wide barriers (parallel.py).
        self.groups = parallel.Groups(
            cfg, rank, tied_embeddings=hp.tied, members_only=bool(args.warm_control), timeout=args.timeout
        )
        self.stage = gpt.Stage(model, cfg, self.groups, args.seed, self.device)
        self.stage.recompute = gpt.Recompute.from_args(args)
        if args.flextp_straggler is not None:
            self.stage.flex = flextp.FlexTp(self.groups, args.flextp_straggler)
        self.opt = optimizer.Adam(self.stage, self.groups, lr=args.lr, weight_decay=args.weight_decay)
        self.corpus = data.Corpus(args.data, hp.vocab, args.seq_length)
        self.step = args.start_step or 0
        self.samples_consumed = self.step * args.global_batch_size

    @staticmethod
    def device_of(args):
        """torch.device of --device: cuda:<local rank % visible GPUs> (LOCAL_RANK under
        torchrun, else the world rank: launch.py starts every rank on this machine), made
        torch's current device."""
        if args.device == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA device")
        local = int(os.environ.get("LOCAL_RANK", args.world_rank))
        d = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(d)
        return d

    # ---- state hand-off --------------------------------------------------------

    def state_tensors(self):
        """[(local name, tensor)] of everything the rank holds (spec §4-§5), padding zeroed."""
        st = self.stage
        dt = gpt.TORCH_DTYPE[st.dtype]
        flat = st.flat.masked_fill(st.pad_mask, 0.0)
        out = [(p.name, st.view(flat, p).to(dt).clone()) for p in st.params]
        return out + self.opt.state_tensors()

    def load_state_tensors(self, tensors):
        st = self.stage
        dt = gpt.TORCH_DTYPE[st.dtype]
        for p in st.params:
            t = tensors.get(p.name)
            if t is None:
                raise KeyError(f"checkpoint lacks tensor {p.name}")
            if list(t.shape) != p.shape or t.dtype != dt:
                raise ValueError(
                    f"checkpoint tensor {p.name} is {t.dtype} {list(t.shape)}, expected {p.dtype} {p.shape}"
                )
            st.view(st.flat, p).copy_(t.float())
        used = set(self.opt.load_state_tensors(tensors)) | {p.name for p in st.params}
        extra = sorted(set(tensors) - used)
        if extra:
            raise ValueError(f"checkpoint holds tensors this layout does not: {extra[:5]}")
        st.flat.masked_fill_(st.pad_mask, 0.0)

    def info(self):
        a = self.args
        return {
            "model": self.model.desc,
            "config": str(self.cfg),
            "step": self.step,
            "samples_consumed": self.samples_consumed,
            "seed": a.seed,
            "global_batch_size": a.global_batch_size,
            "seq_length": a.seq_length,
        }

    def restore(self, what, info, read_tensors):
        """Loads state described by `info` (a version's info: {"config", "model", "step",
        "samples_consumed", ...}), typed and validated by tenplex (StateInfo)."""
        state = _tenplex.StateInfo.parse(json.dumps(info))  # InvalidArgumentError: a ValueError
        if L.Config.parse(str(state.config)) != self.cfg:
            raise ValueError(
                f"{what} is in config {state.config}, this run is {self.cfg}: "
                f"convert it with `tenplex reshard --in DIR --to {self.cfg} --out DIR2`"
            )
        if json.loads(state.model_json) != self.model.desc:
            raise ValueError(f"{what} holds a different model than --model")
        # The training position must come with the state: assuming step 0 would silently
        # restart the data order and the optimizer's step count.
        try:
            step, samples = state.resume_position(what)
        except _tenplex.Error as e:
            raise ValueError(
                f"{e}: refusing to guess; save it with its step (tenplex store save keeps every field)"
            ) from None
        if self.args.start_step is not None and self.args.start_step != step:
            raise ValueError(f"--start-step {self.args.start_step} but {what} is at step {step}")
        self.load_state_tensors(read_tensors())
        self.step = step
        self.samples_consumed = samples if samples is not None else step * self.args.global_batch_size

    def load(self, directory):
        self.restore(
            f"checkpoint {directory}",
            checkpoint.read_info(directory),
            lambda: checkpoint.read_rank(directory, self.rank),
        )

    def load_handoff(self, path, keep=None):
        """Loads the hand-off `path`; with `keep` (a warm worker's handoff.KeptState of
        its last stop) the tensors whose files the plan linked unchanged are reused."""
        h = handoff.read(path)
        # (A warm worker re-joins at every change: one read per tensor, no map. On a GPU
        # the files go straight into device tensors.)
        if keep is not None:
            device = self.device if self.device.type == "cuda" else None
            self.restore(f"hand-off {path}", h, lambda: handoff.read_rank(h, self.rank, device=device, keep=keep))
            return
        if self.device.type == "cuda":
            self.restore(f"hand-off {path}", h, lambda: handoff.read_rank(h, self.rank, device=self.device))
            return
        read = handoff.read_rank if self.args.warm_control else handoff.map_rank
        self.restore(f"hand-off {path}", h, lambda: read(h, self.rank))

    def save_handoff(self, path, keep=None):
        """Writes the state into the hand-off `path`; with `keep` (a warm worker's stop)
        the written tensors are kept for the next segment's load (handoff.KeptState)."""
        t0 = time.perf_counter()
        handoff.wait_for(path, self.args.timeout, warm.ABORT)  # the runner opens versions one by one
        h, tensors = handoff.read(path), self.state_tensors()
        handoff.write_rank(h, self.rank, tensors)
        if keep is not None:
            keep.remember(h, self.rank, tensors)
        dist.barrier()
        if self.rank == 0:
            handoff.write_result(path, self.step, self.samples_consumed, durable=not self.args.warm_control)
            self.log_event({"event": "commit", "step": self.step, "seconds": round(time.perf_counter() - t0, 4)})

    def log_event(self, rec):
        if self.args.log:
            with open(self.args.log, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def save(self, directory):
        t0 = time.perf_counter()
        if self.rank == 0:
            checkpoint.begin(directory)
        dist.barrier()
        checkpoint.write_rank(
            directory,
            self.rank,
            [(n, t.cpu()) for n, t in self.state_tensors()],
            {"config": str(self.cfg), "rank": str(self.rank)},
        )
        dist.barrier()
        if self.rank == 0:
            checkpoint.commit(directory, self.info(), self.cfg.world_size)
        dist.barrier()
        if self.rank == 0:
            self.log_event(
                {
                    "event": "checkpoint",
                    "step": self.step,
                    "dir": directory,
                    "seconds": round(time.perf_counter() - t0, 4),
                }
            )

    # ---- one step ----------------------------------------------------------------

    def train_step(self):
        a, g, st, cfg = self.args, self.groups, self.stage, self.cfg
        meter.METER.start_step()
        if st.flex is not None:
            st.flex.new_step()
        global_ids, _ = data.step_samples(
            len(self.corpus), a.seed, a.global_batch_size, self.samples_consumed, cfg.dp, g.dp_rank
        )
        begin, end = uneven.dp_slice(a.global_batch_size, cfg, g.dp_rank)  # dp_weights, spec §9
        ids = global_ids[begin:end]
        total_tokens = self.corpus.valid_tokens(global_ids)
        inputs, labels, mask = (t.to(self.device) for t in self.corpus.batch(ids))
        w = st.make_weights()
        h = st.hp.hidden
        micro = [(i, min(i + a.micro_batch_size, len(ids))) for i in range(0, len(ids), a.micro_batch_size)]
        # GPipe: all forwards, then all backwards, micro-batches in order.
        saved, loss_sum = [], 0.0
        for b, e in micro:
            if g.first_stage:
                inp = inputs[b:e]
            else:
                inp = parallel.recv(torch.empty(e - b, a.seq_length, h, device=self.device), g.prev_rank())
                inp.requires_grad_(True)
            out = st.forward(inp, labels[b:e], mask[b:e], total_tokens)
            if g.last_stage:
                loss_sum += out.item()
            else:
                parallel.send(out.detach().contiguous(), g.next_rank())
            saved.append((inp, out))
        for inp, out in saved:
            if g.last_stage:
                out.backward()
            else:
                out.backward(parallel.recv(torch.empty_like(out), g.next_rank()))
            if not g.first_stage:
                parallel.send(inp.grad.contiguous(), g.prev_rank())
        saved.clear()
        # Tied embeddings across stages: first and last stage sum their gradients.
        if g.embed is not None:
            name = "embedding.word_embeddings.weight" if g.first_stage else "output_layer.weight"
            if w[name].grad is None:
                w[name].grad = torch.zeros_like(w[name])
            parallel.all_reduce(w[name].grad, g.embed, g.embed_ranks)
        grad = st.flat_grad()
        parallel.all_reduce(grad, g.dp, g.dp_ranks)
        # Global gradient norm over unique elements (fp64), clipped as Megatron does.
        sq = torch.tensor([grad.double()[st.norm_mask].pow(2).sum().item()], dtype=torch.float64)
        parallel.all_reduce(sq, g.mp, g.mp_ranks)
        norm = sq.sqrt().item()
        if a.clip_grad > 0:
            coeff = a.clip_grad / (norm + 1e-6)
            if coeff < 1.0:
                grad.mul_(coeff)
        self.opt.step(grad, self.step + 1)
        # The step's loss: sum over the global batch's tokens / their count; and every
        # rank's own compute seconds (meter.py) in the same all-reduce.
        lt = torch.zeros(1 + cfg.world_size, dtype=torch.float64)
        lt[0] = loss_sum if (g.last_stage and g.tp_rank == 0) else 0.0
        lt[1 + self.rank] = meter.METER.end_step()
        dist.all_reduce(lt)
        self.rank_seconds = [round(x, 5) for x in lt[1:].tolist()]
        self.step += 1
        self.samples_consumed += a.global_batch_size
        return lt[0].item(), norm, global_ids


def fail(msg):
    print(f"train.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def raise_if_aborted():
    """Before a collective: a warm worker whose segment the runner aborted (a peer
    failed) stops here instead of entering the collective on the connections its
    watcher has shut (warm.py), where gloo could wait forever."""
    if warm.ABORT.is_set():
        raise warm.Aborted("the runner aborted the segment (before a collective)")


def or_fail(rank, fn, arg):
    """Runs fn(arg); bad state (missing or mis-shaped tensors, wrong config) exits 2."""
    try:
        fn(arg)
    except (ValueError, KeyError, OSError) as e:
        if warm.ABORT.is_set():  # a warm worker's segment aborted by the runner
            raise warm.Aborted(str(e)) from None
        fail(f"rank {rank}: {e}")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.elastic:
        try:  # (run_segment checks it with the other arguments)
            gpt.Recompute.from_args(args)
        except ValueError as e:
            fail(e)
        return elastic_train.main(args, Trainer, fail)
    if args.warm_control:
        return warm.serve(args, sys.argv[1:] if argv is None else argv, parse_args, run_segment)
    run_segment(args)


def run_segment(args, control=None):
    """One segment of `tenplex run` (or a whole static run): validates the arguments,
    joins the process group, loads the state, trains --steps steps and writes the state
    out. With a warm control (`tenplex run --warm`) the process group is destroyed at the
    end and the process lives on for its next segment."""
    try:
        if not args.config:
            raise ValueError("--config is required (or --elastic POLICY under torchrun)")
        cfg = L.Config.parse(args.config)
        if args.model and os.path.isfile(args.model):
            model = L.Model.load(args.model)
        elif args.load_dir:
            model = L.Model(checkpoint.read_info(args.load_dir)["model"])
        elif args.state_in or args.state_out:
            # The first hand-off the runner has written: --state-in, else --state-out or,
            # with periodic commits, the first of those.
            first = args.state_in or args.state_out
            if not args.state_in and args.commit_every > 0 and not os.path.exists(first):
                first = f"{args.commit_prefix}{(args.start_step or 0) + args.commit_every}.json"
            if control is not None:  # with --warm the runner writes --state-in while we re-join
                handoff.wait_for(first, args.timeout, warm.ABORT)
            model = L.Model(handoff.read(first)["model"])
        else:
            raise ValueError("give --model (a JSON file from `tenplex model gpt`), --load-dir or --state-in")
        L.validate(model, cfg)
        hp = gpt.HParams(model.info)
        if model.optimizer_states != ["exp_avg", "exp_avg_sq"]:
            raise ValueError("the model must have --optimizer adam (its state is exp_avg and exp_avg_sq)")
        if cfg.world_size != args.world_size:
            raise ValueError(f"config {cfg} needs world size {cfg.world_size}, got --world-size {args.world_size}")
        if not 0 <= args.world_rank < args.world_size:
            raise ValueError(f"--world-rank {args.world_rank} is not in [0, {args.world_size})")
        if args.global_batch_size < cfg.dp:
            raise ValueError(f"--global-batch-size {args.global_batch_size} is smaller than dp={cfg.dp}")
        shares = uneven.apportion(args.global_batch_size, uneven.dp_weights(cfg))
        if min(shares) < 1:
            raise ValueError(
                f"dp rank {shares.index(0)} gets no sample of the global batch of "
                f"{args.global_batch_size} with dp_weights {uneven.dp_weights(cfg)}"
            )
        if args.flextp_straggler is not None and (
            not 0 <= args.flextp_straggler < cfg.tp or uneven.tp_weights(cfg) != [1] * cfg.tp
        ):
            raise ValueError(
                f"--flextp-straggler {args.flextp_straggler} needs an even split with a tp rank in [0, {cfg.tp})"
            )
        slowdown = meter.parse_slowdown(args.slowdown)
        if slowdown and max(slowdown) >= args.world_size:
            raise ValueError(f"--slowdown rank {max(slowdown)} is not a rank of world size {args.world_size}")
        meter.METER.factor = slowdown.get(args.world_rank, 1.0)
        meter.METER.before_comm = raise_if_aborted
        # (The emulated sleep is not cut short by a warm abort: a rank woken so entered its
        # next collective on the connections its watcher had broken, and hung there;
        # a rebalance's stop is now agreed at a step boundary instead, docs/hetero.md.)
        gpt.Recompute.from_args(args)
        if args.micro_batch_size < 1 or args.seq_length < 1 or args.steps < 0:
            raise ValueError("--micro-batch-size and --seq-length must be >= 1, --steps >= 0")
        if not hp.rope and args.seq_length > hp.max_positions:
            raise ValueError(f"--seq-length {args.seq_length} exceeds max_position_embeddings {hp.max_positions}")
        if args.save_dir:
            checkpoint.check_target(args.save_dir)
        if args.save_at is not None and not args.save_dir:
            raise ValueError("--save-at needs --save-dir")
        if args.commit_every < 0 or (args.commit_every > 0 and not (args.commit_prefix and args.state_out)):
            raise ValueError("--commit-every N needs N >= 0, --commit-prefix and --state-out")
        if args.load_dir and args.state_in:
            raise ValueError("give --load-dir or --state-in, not both")
        if args.device == "cuda" and args.flextp_straggler is not None:
            raise ValueError("--flextp-straggler runs on --device cpu only")
        Trainer.device_of(args)
    except (ValueError, KeyError, OSError) as e:
        fail(e)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    stamp = control.times.__setitem__ if control is not None else lambda k, t: None
    stamp("start", time.perf_counter())
    if control is not None and args.world_rank != 0:
        warm.wait_port(args.master_addr, args.master_port, args.timeout)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.world_rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    if control is not None:
        control.watch()  # the runner's abort (a failed peer) breaks this world's connections
    stamp("pg", time.perf_counter())
    rank = args.world_rank
    # A warm worker keeps the state it wrote at its last stop, on its device, and reuses
    # the tensors the plan left unchanged (linked) instead of reading them again; on the
    # CPU too (it saves the copy out of shared memory), so CPU runs exercise it.
    keep = control.kept if control is not None and not args.no_warm_keep else None
    trainer = Trainer(args, model, cfg, rank)
    stamp("trainer", time.perf_counter())
    if args.load_dir:
        or_fail(rank, trainer.load, args.load_dir)
    elif args.state_in:
        if control is not None:  # the runner's transform ran while we joined the new world
            or_fail(rank, lambda path: handoff.wait_for(path, args.timeout, warm.ABORT), args.state_in)
            stamp("transformed", time.perf_counter())
        or_fail(rank, lambda path: trainer.load_handoff(path, keep), args.state_in)
    if control is not None:
        stamp("loaded", time.perf_counter())
        if rank == 0:
            ev = warm.join_event(control.times, trainer.step)
            if keep is not None and keep.stats:  # rank 0's own tensors
                st = keep.stats
                ev.update(
                    kept_tensors=st["kept_tensors"],
                    kept_mb=round(st["kept_bytes"] / 1e6, 3),
                    loaded_tensors=st["loaded_tensors"],
                    loaded_mb=round(st["loaded_bytes"] / 1e6, 3),
                )
            trainer.log_event(ev)
        control.times.clear()
        control.kept.clear()  # (used by the load, or none was: not for a later segment)
    if args.save_at is not None and not trainer.step <= args.save_at <= trainer.step + args.steps:
        fail(
            f"--save-at {args.save_at} is outside the steps of this run ({trainer.step} to {trainer.step + args.steps})"
        )
    times = []
    end = trainer.step + args.steps
    for _ in range(args.steps):
        if args.save_dir and args.save_at == trainer.step:
            or_fail(rank, trainer.save, args.save_dir)
        t0 = time.perf_counter()
        step = trainer.step
        loss, norm, ids = trainer.train_step()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            rec = {
                "step": step,
                "loss": loss,
                "config": str(cfg),
                "samples": ids,
                "micro_batch": args.micro_batch_size,
                "recompute": trainer.stage.recompute.describe(),
                "grad_norm": norm,
                "seconds": round(times[-1], 4),
                "rank_seconds": trainer.rank_seconds,
            }
            print(json.dumps(rec), flush=True)
            trainer.log_event(rec)
        n = args.commit_every
        if n > 0 and trainer.step < end and (trainer.step - (end - args.steps)) % n == 0:
            or_fail(rank, trainer.save_handoff, f"{args.commit_prefix}{trainer.step}.json")
        if control is not None and trainer.step < end and warm.stop_agreed():
            raise warm.Stopped(f"at step {trainer.step}")
    if args.save_dir and args.save_at in (None, trainer.step):
        or_fail(rank, trainer.save, args.save_dir)
    if args.state_out:
        or_fail(rank, lambda path: trainer.save_handoff(path, keep), args.state_out)
    stamp("saved", time.perf_counter())
    if not (control and args.state_out):
        dist.barrier()  # (with a hand-off the commit's barrier is the last collective)
    if rank == 0 and times:
        steady = times[1:] or times
        print(
            f"train.py: config {cfg}: {len(times)} steps, {sum(steady) / len(steady):.3f} s/step (after the first)",
            file=sys.stderr,
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
