"""Torch's lazy imports on the training path, paid before the job's first world (private:
a workaround for the torch versions we run, 2.x up to at least 2.15).

torch imports ``torch.fx.experimental.symbolic_shapes``, and with it sympy, the first time
a process calls ``backward()`` with an explicit gradient (autograd's ``_make_grads``
checks the gradient's shape with it): 0.6-1.0 s of CPU on the project's 2-core machine.
Every pipeline stage but the last does that in every step. A worker that stays alive
across worlds (membership mode, docs/deploy.md) and moves from the last stage to an
earlier one would pay it inside the new world's first step, i.e. inside the
reconfiguration (the leave of `membership_leave` spent 0.8 s of its 1.34 s first step
there). Running the same call once on a one-element tensor before the worker reports
ready moves that cost to the worker's start, before its host registers, where the
imports of torch itself already are. Warm workers of ``tenplex run --warm``
(``tenplex.warm.serve``) do the same when they start, for the same reason.
"""

import logging
import time

import torch

log = logging.getLogger("tenplex.membership")


def warm_backward() -> float:
    """Runs backward() with an explicit gradient on a one-element tensor, so that the
    imports it triggers are done; returns the seconds it took. Never raises: a failure
    is logged and only means the first real step pays the imports."""
    t0 = time.perf_counter()
    try:
        x = torch.zeros(1, requires_grad=True)
        (x * 2.0).backward(torch.ones(1))
    except Exception as e:  # noqa: BLE001 - a warm-up must never stop the worker
        log.warning("torch warm-up (backward with a gradient) failed: %s", e)
    seconds = time.perf_counter() - t0
    log.debug("torch warm-up (backward with a gradient): %.3f s", seconds)
    return seconds
