"""python -m tenplex.interop import|export ... (run by `tenplex import` / `tenplex export`).

Prints one line on success: a sentence, or with --json one JSON object ({"format",
"bytes", "seconds", "out"}; import adds "step"), nothing with --quiet; on bad input
prints "tenplex: error: <message>" and exits 2, on other failures exits 1. Nothing is
left at --out unless the conversion finished.

An import whose source records no training step (a Hugging Face model, a Megatron
`release` checkpoint) records step 0 and 0 samples, so that training starts from it as
from a fresh model (examples/gpt/train.py refuses state without a step); `--step`
overrides it.
"""

import argparse
import json
import logging
import sys
import time
from typing import Any

from .._cli import cli_logging
from . import dcp, ds, hf, mcore, megatron, ptc
from .ptc import InteropError

FORMATS = ("dcp", "megatron", "hf", "ds-universal", "mcore")


log = logging.getLogger("tenplex.interop")  # not __name__: "__main__" under python -m


def _log(msg: str) -> None:
    """What the conversion tells the user (the format modules' callback), on stderr."""
    log.warning("%s", msg)


def run_import(a: argparse.Namespace) -> tuple[int, int]:
    with open(a.model_file) as f:
        model = json.load(f)
    lay = ptc.layout(a.tenplex, a.model_file, a.config)
    extra: dict[str, Any] = {}
    w = ptc.Writer(a.out, model, lay, extra)
    try:
        if a.fmt == "dcp":
            zero_ok = dcp.import_(a.src, w)
        elif a.fmt == "ds-universal":
            zero_ok = ds.import_(a.src, w, _log)
        elif a.fmt == "mcore":
            zero_ok = mcore.import_(a.src, w)
        elif a.fmt == "megatron":
            zero_ok = megatron.import_(a.tenplex, a.model_file, a.src, w, _log)
        else:
            hf.import_(a.src, w, _log)
            zero_ok = ["optimizer."]
        if a.step is not None:
            w.extra["step"] = a.step
        if a.samples is not None:
            w.extra["samples_consumed"] = a.samples
        if "step" not in w.extra:
            _log(f"import: {a.src} records no training step: recorded step 0 (--step N sets one)")
            w.extra["step"] = 0
            w.extra.setdefault("samples_consumed", 0)
        w.finish(zero_ok)
    except BaseException:
        w.abort()
        raise
    return sum(t["bytes"] if "bytes" in t else 0 for t in lay["ranks"]), w.extra["step"]


def run_export(a: argparse.Namespace) -> int:
    if a.fmt == "ds-universal":
        raise InteropError(
            "export --to ds-universal is not supported (import only): DeepSpeed loads a "
            "universal checkpoint into its own engine; export --to dcp or hf instead"
        )
    reader = ptc.Reader.directory(a.tenplex, a.src)
    if a.fmt == "hf":
        return hf.export(reader, a.out, a.max_shard_size)
    if a.fmt == "dcp":
        if a.config and a.config != reader.info["config"]:
            raise InteropError(
                f"export --to dcp writes the checkpoint's own layout ({reader.info['config']}); "
                f"reshard it to {a.config} first (tenplex reshard), any layout can load it"
            )
        return dcp.export(reader, a.out)
    if a.fmt == "mcore":
        return mcore.export(reader, a.out, a.config)
    model_file = reader.model_file
    return megatron.export(a.tenplex, model_file, reader, a.out, a.config)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tenplex.interop")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("import")
    i.add_argument("--from", dest="fmt", choices=FORMATS, required=True)
    i.add_argument("src")
    i.add_argument("--model-file", required=True)
    i.add_argument("--config", required=True)
    i.add_argument("--out", required=True)
    i.add_argument("--tenplex", required=True)
    i.add_argument("--step", type=int)
    i.add_argument("--samples", type=int)
    e = sub.add_parser("export")
    e.add_argument("--to", dest="fmt", choices=FORMATS, required=True)
    e.add_argument("src")
    e.add_argument("--out", required=True)
    e.add_argument("--tenplex", required=True)
    e.add_argument("--config", default="")
    e.add_argument("--max-shard-size", type=int, default=5 * 10**9)
    for sp in (i, e):
        sp.add_argument("--json", action="store_true")
        sp.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    step = None
    try:
        if a.cmd == "import":
            n, step = run_import(a)
        else:
            n = run_export(a)
    except (InteropError, ptc.ckpt.CheckpointError, ptc.st.SafetensorsError) as err:
        log.error("error: %s", err)
        return 2
    except OSError as err:  # disk full, permissions: not the input's fault
        log.error("error: %s", err)
        return 1
    finally:
        ptc.cleanup()
    _report(a, int(n), time.perf_counter() - t0, step)
    return 0


def _human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _report(a: argparse.Namespace, n: int, seconds: float, step: "int | None") -> None:
    if a.json:
        out = {"format": a.fmt, "bytes": n, "seconds": round(seconds, 6), "out": a.out}
        if step is not None:
            out["step"] = step
        print(json.dumps(out))
    elif a.quiet:
        pass
    elif a.cmd == "import":
        print(
            f"imported {a.fmt} checkpoint {a.src} into {a.out} ({a.config}, step {step}): "
            f"{_human_bytes(n)} in {seconds:.2f} s"
        )
    else:
        print(f"exported {a.src} as {a.fmt} into {a.out}: {_human_bytes(n)} in {seconds:.2f} s")


if __name__ == "__main__":
    cli_logging("tenplex: %(message)s")
    sys.exit(main(sys.argv[1:]))
