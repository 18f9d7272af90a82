"""Converting checkpoints between tenplex (spec ptc-layout.md §7) and the formats users
already have: PyTorch distributed checkpoints (dcp.py), Megatron-LM's non-distributed
checkpoints (megatron.py) and Hugging Face safetensors models (hf.py).

`tenplex import` / `tenplex export` (src/tenplex/cli/interop.cc) run this package with
the project's .venv/bin/python (`python -m tenplex.interop`): the torch formats are pickles only
torch reads, and keeping all three codecs in one place shares the piece arithmetic of
ptc.py. The C++ command checks the arguments, the model and the config first, and
checks every imported checkpoint against its own layout afterwards.
"""
