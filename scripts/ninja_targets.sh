# Sourced by scripts/test.sh and scripts/fuzz.sh.
# ninja_targets DIR SUFFIXES: the tenplex_*_<suffix> targets of the build directory DIR,
# one a line, sorted (SUFFIXES: a sed alternation, e.g. 'test\|fuzz').
ninja_targets() {
  ninja -C "$1" -t targets all | sed -n "s/^\(tenplex_[A-Za-z0-9_]*_\($2\)\): phony\$/\1/p" | sort -u
}
