"""diffeqformer.numerics and diffeqformer.cache: the integer check, netCDF files that round-trip what netCDF3 cannot
hold, the disk cache."""

import numpy as np
import pytest
import xarray as xr

from diffeqformer.cache import cached, digest, load_netcdf, save_netcdf
from diffeqformer.numerics import check_positive_int


@pytest.mark.parametrize("value", [1, 7, np.int32(3), np.int64(2)])
def test_positive_integers_pass(value):
    check_positive_int(value, "n")


@pytest.mark.parametrize("value", [0, -1, 2.0, 2.5, True, "3", None])
def test_anything_else_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^steps must be a positive integer, got "):
        check_positive_int(value, "steps")


def test_netcdf_round_trip_is_identical(tmp_path):
    ds = xr.Dataset(
        {"lam": (("layer", "eig"), np.array([[1 + 2j, 3 - 1j], [0j, -1j]]), {"description": "eigenvalues"}),
         "ok": ("layer", np.array([True, False])),
         "steps": ("layer", np.array([5, 6], np.int32)),
         "x": (("layer", "eig"), np.array([[0.5, np.nan], [1.0, 2.0]]))},
        coords={"layer": np.arange(2), "eig": np.arange(2, dtype=np.int32), "time": ("layer", [0.5, 1.0])},
        attrs={"config": "{}", "flag": 1},
    )
    back = load_netcdf(save_netcdf(ds, tmp_path / "sub" / "ds.nc"))
    assert back.identical(ds)
    assert back["layer"].dtype == np.int64 and back["eig"].dtype == np.int32 and back["ok"].dtype == bool


def test_cached_computes_once_and_writes_atomically(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return "value"

    def save(value, path):
        path.with_suffix(".json").write_text("sidecar")  # a sidecar file moves into place too
        path.write_text(value)

    path = tmp_path / f"thing-{digest({'a': 1})}.txt"
    step = {"save": save, "load": lambda p: p.read_text(), "suffix": ".txt"}
    assert cached(tmp_path, "thing", {"a": 1}, compute, **step) == "value"
    assert cached(tmp_path, "thing", {"a": 1}, compute, **step) == "value"
    assert len(calls) == 1 and path.with_suffix(".json").read_text() == "sidecar"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, path.with_suffix(".json").name])

    def broken(value, path):
        path.write_text(value[:2])
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cached(tmp_path, "other", {"a": 2}, compute, save=broken, load=lambda p: p.read_text(), suffix=".txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [path.name, path.with_suffix(".json").name])  # no half-written file, no temporary folder left
    assert cached(None, "thing", {"a": 1}, compute, **step) == "value" and len(calls) == 3


def test_digest_is_the_sorted_json_hash():
    assert digest({"b": 1, "a": [1, 2]}) == digest({"a": [1, 2], "b": 1})
    assert len(digest({})) == 16 and digest({"a": 1}) != digest({"a": 2})
