"""tenplex: state management for jobs whose parallelism changes while they run.

Pure-Python parts (no native module needed): `tenplex.layout` (parallel configs and
what each rank holds, spec ptc-layout.md §3-§5), `tenplex.safetensors` (reader and
writer), `tenplex.checkpoint` (checkpoint directories, spec §7).
"""
