# UCX, the data plane's library (src/tenplex/transport), as the target tp_ucx.
#
# By default the libucx wheel of the project's Python environment (TENPLEX_PY): UCX 1.22,
# pinned in requirements.lock, which scripts/install-deps.sh installs before CMake runs.
# Debian 12's libucx0 (1.13.1) is built with assertions, and one of them
# (ucp_request.c:684 "got REP message", removed upstream in UCX 1.14) aborts the store
# daemon when a data-plane client dies while the daemon's wireup reply to it waits
# (docs/reliability.md, "The UCX abort"). The wheel's UCX is newer and built without
# assertions. Its pkg-config files name the prefix it was built in, so the wheel's own
# relocatable CMake package (lib/cmake/ucx) is used.
#
#   TENPLEX_UCX=auto    the wheel where TENPLEX_PY has it, else the system's (a warning)
#   TENPLEX_UCX=wheel   the wheel or a configure error
#   TENPLEX_UCX=system  pkg-config's ucx (a machine without the wheel: scripts/gpu_check.sh)
#
# Included by the top-level CMakeLists.txt (CMAKE_INSTALL_RPATH_USE_LINK_PATH must be set
# before the executables are made). Only the transport's own sources include
# <ucp/api/ucp.h>: tp_ucx is linked PRIVATE there, and executables find the wheel's
# libraries through their RPATH (build and install: the checkout's .venv stays where it is).
set(TENPLEX_UCX "auto" CACHE STRING "Where UCX comes from: auto, wheel (TENPLEX_PY's libucx), system (pkg-config ucx)")
set_property(CACHE TENPLEX_UCX PROPERTY STRINGS auto wheel system)
# The first release without the assertion (openucx/ucx pull request 8175).
set(TENPLEX_UCX_MIN_VERSION 1.14)

if(NOT TENPLEX_UCX MATCHES "^(auto|wheel|system)$")
  message(FATAL_ERROR "TENPLEX_UCX=${TENPLEX_UCX}: not one of auto, wheel, system")
endif()

set(_tp_ucx_wheel "")
if(NOT TENPLEX_UCX STREQUAL "system")
  if(EXISTS "${TENPLEX_PY}")
    execute_process(
      COMMAND "${TENPLEX_PY}" -c "import libucx, os; print(os.path.dirname(libucx.__file__))"
      OUTPUT_VARIABLE _tp_ucx_out ERROR_VARIABLE _tp_ucx_err RESULT_VARIABLE _tp_ucx_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_tp_ucx_rc EQUAL 0 AND EXISTS "${_tp_ucx_out}/lib/cmake/ucx/ucx-config.cmake")
      set(_tp_ucx_wheel "${_tp_ucx_out}")
    endif()
  endif()
  if(NOT _tp_ucx_wheel)
    set(_tp_ucx_why "${TENPLEX_PY} has no libucx wheel (scripts/install-deps.sh installs it)")
    if(TENPLEX_UCX STREQUAL "wheel")
      message(FATAL_ERROR "TENPLEX_UCX=wheel: ${_tp_ucx_why}")
    endif()
    message(WARNING "UCX: ${_tp_ucx_why}; using the system's UCX. Debian 12's UCX 1.13 "
                    "aborts the store daemon when a data-plane client dies mid-wireup "
                    "(docs/reliability.md).")
  endif()
endif()

add_library(tp_ucx INTERFACE)
if(_tp_ucx_wheel)
  find_package(ucx ${TENPLEX_UCX_MIN_VERSION} CONFIG REQUIRED
               PATHS "${_tp_ucx_wheel}/lib/cmake/ucx" NO_DEFAULT_PATH)
  target_link_libraries(tp_ucx INTERFACE ucx::ucp ucx::uct ucx::ucs)
  # Installed executables (cmake --install) keep the wheel's library folder: without it
  # they would load the system's libucp.so.0 of the same soname (and refuse to start the
  # data plane, ucx_version.h). CMAKE_INSTALL_RPATH_USE_LINK_PATH would not add it: the
  # venv is inside the project.
  list(APPEND CMAKE_INSTALL_RPATH "${_tp_ucx_wheel}/lib")
  message(STATUS "UCX ${ucx_VERSION}: the wheel in ${_tp_ucx_wheel}")
else()
  pkg_check_modules(TP_UCX REQUIRED IMPORTED_TARGET ucx)
  target_link_libraries(tp_ucx INTERFACE PkgConfig::TP_UCX)
  message(STATUS "UCX ${TP_UCX_VERSION}: the system's (pkg-config)")
endif()
