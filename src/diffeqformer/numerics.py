"""Two numerical helpers every layer uses: the check of a positive integer argument, and one BLAS thread for
batches of small matrix factorisations. The bottom layer of the package: it imports none of its modules."""

from __future__ import annotations

import contextlib

import numpy as np


def check_positive_int(value, name: str) -> None:
    """Raise ``ValueError("<name> must be a positive integer, got <value>")`` unless ``value`` is an integer >= 1.

    Python and NumPy integers pass; ``bool`` (an ``int`` subclass), floats such as 2.0 and anything else do not.
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@contextlib.contextmanager
def one_blas_thread():
    """Run the block with the BLAS libraries limited to one thread (threadpoolctl; restored afterwards).

    Why: the eigensolvers' and QR factorisations' matrices are small and many. On a machine shared with other
    processes, OpenBLAS's spinning worker threads make such batches far slower than one thread does, and one thread is
    never much slower (measurements page).
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
