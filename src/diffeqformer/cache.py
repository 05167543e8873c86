"""The disk cache every expensive analysis goes through (``cached``), the keys it is named by (``digest``, a model's
``fingerprint``, ``file_sha256``), atomic writes, and netCDF files that round-trip what netCDF3 cannot hold.

The bottom layer of the package: it imports none of its modules. ``xarray`` is imported where it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import draccus
import jax
import numpy as np

if TYPE_CHECKING:
    import xarray as xr

T = TypeVar("T")


def fingerprint(model) -> str:
    """16 hex digits of the SHA-256 of a model's configuration (draccus's encoding, as sorted JSON) and of every array
    leaf's bytes, in pytree order: the key by which analyses of a model are cached."""
    h = hashlib.sha256(json.dumps(draccus.encode(model.config), sort_keys=True).encode())
    for leaf in jax.tree_util.tree_leaves(model):  # a NamedArray is a pytree: its leaves are the raw arrays
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()[:16]


def digest(key: Any) -> str:
    """16 hex digits of the SHA-256 of ``key`` as JSON with sorted keys: a cache file's name for a configuration."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex), read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_atomically(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(p)`` to write ``path`` (and any sidecar files beside it) in a hidden temporary folder beside it,
    then move what it wrote into place (``os.replace``) with ``path`` itself last, so that ``path`` exists only once it
    and its sidecars are complete: a process killed while writing leaves the old files or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.tmp-") as tmp:
        write(Path(tmp) / path.name)
        for f in sorted(Path(tmp).iterdir(), key=lambda f: f.name == path.name):
            os.replace(f, path.parent / f.name)
    return path


def cached(cache_dir: str | Path | None, name: str, key: Any, compute: Callable[[], T], *,
           save: Callable[[T, Path], Any], load: Callable[[Path], T], suffix: str) -> T:
    """The one cached step of the analyses: ``load`` of ``cache_dir/<name>-<digest(key)><suffix>`` if that file
    exists, else ``compute()``, written there with ``save(value, path)`` (``write_atomically``) and returned; with
    ``cache_dir=None`` nothing is read or written. ``key`` is everything the result depends on, as JSON (a model
    enters by its ``fingerprint``), so a file that exists is the result asked for."""
    if cache_dir is None:
        return compute()
    path = Path(cache_dir) / f"{name}-{digest(key)}{suffix}"
    if path.exists():
        return load(path)
    value = compute()
    write_atomically(path, lambda p: save(value, p))
    return value


def save_netcdf(ds: "xr.Dataset", path: str | Path) -> Path:
    """Write a Dataset to netCDF3 (``engine="scipy"``, no extra dependency), encoding the types netCDF3 lacks: complex
    ``v`` becomes float ``v_real`` and ``v_imag`` (attrs copied, plus ``complex_part``), bool becomes int8 and int64
    int32 (values must fit), each with ``attrs["dtype"]`` naming the original type. ``load_netcdf`` undoes it."""
    import xarray as xr

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    variables = {}
    for name, var in ds.data_vars.items():
        if np.iscomplexobj(var.values):
            variables[f"{name}_real"] = _with_attrs(var.variable.real, {**var.attrs, "complex_part": "real"})
            variables[f"{name}_imag"] = _with_attrs(var.variable.imag, {**var.attrs, "complex_part": "imag"})
        else:
            variables[name] = _narrowed(var.variable)
    coords = {name: _narrowed(c.variable) for name, c in ds.coords.items()}
    xr.Dataset(variables, coords=coords, attrs=ds.attrs).to_netcdf(path, engine="scipy")
    return path


def _with_attrs(var, attrs: dict):
    """A copy of the ``xarray.Variable`` ``var`` with ``attrs`` in place of its own."""
    out = var.copy(deep=False)
    out.attrs = dict(attrs)
    return out


def _narrowed(var):
    if var.dtype == bool:
        return _with_attrs(var.astype(np.int8), {**var.attrs, "dtype": "bool"})
    if var.dtype == np.int64:
        return _with_attrs(var.astype(np.int32), {**var.attrs, "dtype": "int64"})
    return var


def load_netcdf(path: str | Path) -> "xr.Dataset":
    """Read a Dataset written by ``save_netcdf``: complex variables joined again, bool and int64 restored (the
    marking attrs dropped), so that ``load_netcdf(save_netcdf(ds, p))`` is identical to ``ds`` (``Dataset.identical``;
    the data variables come in the file's order, which the scipy engine may change)."""
    import xarray as xr

    with xr.open_dataset(path, engine="scipy") as f:
        ds = f.load()
    variables = {}
    for name, var in ds.data_vars.items():
        part = var.attrs.get("complex_part")
        if part == "real" and name.endswith("_real"):
            base = name[: -len("_real")]
            joined = var.variable + 1j * ds[f"{base}_imag"].variable
            attrs = {k: v for k, v in var.attrs.items() if k != "complex_part"}
            variables[base] = _with_attrs(joined.astype(np.complex128), attrs)
        elif not (part == "imag" and name.endswith("_imag")):
            variables[name] = _widened(var.variable)
    coords = {name: _widened(c.variable) for name, c in ds.coords.items()}
    return xr.Dataset(variables, coords=coords, attrs=ds.attrs)


def _widened(var):
    dtype = var.attrs.get("dtype")
    if dtype in ("bool", "int64"):
        return _with_attrs(var.astype(dtype), {k: v for k, v in var.attrs.items() if k != "dtype"})
    return var
