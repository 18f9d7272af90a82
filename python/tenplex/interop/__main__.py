"""python -m tenplex.interop import|export ... (run by `tenplex import` / `tenplex export`).

Prints one JSON line on success ({"format", "bytes", "seconds", "out"}); on bad input
prints "tenplex: error: <message>" and exits 2, on other failures exits 1. Nothing is
left at --out unless the conversion finished.
"""
import argparse
import json
import sys
import time

from . import dcp, ds, hf, mcore, megatron, ptc
from .ptc import InteropError

FORMATS = ("dcp", "megatron", "hf", "ds-universal", "mcore")


def _log(msg):
    print("tenplex: " + msg, file=sys.stderr)


def run_import(a):
    with open(a.model_file) as f:
        model = json.load(f)
    lay = ptc.layout(a.tenplex, a.model_file, a.config)
    extra = {}
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
        w.finish(zero_ok)
    except BaseException:
        w.abort()
        raise
    return sum(t["bytes"] if "bytes" in t else 0 for t in lay["ranks"])


def run_export(a):
    if a.fmt == "ds-universal":
        raise InteropError("export --to ds-universal is not supported (import only): DeepSpeed loads a "
                           "universal checkpoint into its own engine; export --to dcp or hf instead")
    reader = ptc.Reader.directory(a.tenplex, a.src)
    if a.fmt == "hf":
        return hf.export(reader, a.out, a.max_shard_size)
    if a.fmt == "dcp":
        if a.config and a.config != reader.info["config"]:
            raise InteropError(f"export --to dcp writes the checkpoint's own layout ({reader.info['config']}); "
                               f"reshard it to {a.config} first (tenplex reshard), any layout can load it")
        return dcp.export(reader, a.out)
    if a.fmt == "mcore":
        return mcore.export(reader, a.out, a.config)
    model_file = reader.model_file
    return megatron.export(a.tenplex, model_file, reader, a.out, a.config)


def main(argv):
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
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        n = run_import(a) if a.cmd == "import" else run_export(a)
    except (InteropError, ptc.ckpt.CheckpointError, ptc.st.SafetensorsError) as err:
        print(f"tenplex: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # disk full, permissions: not the input's fault
        print(f"tenplex: error: {err}", file=sys.stderr)
        return 1
    finally:
        ptc.cleanup()
    print(json.dumps({"format": a.fmt, "bytes": int(n), "seconds": round(time.perf_counter() - t0, 6),
                      "out": a.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
