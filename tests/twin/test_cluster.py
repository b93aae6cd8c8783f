"""Where the twin's runs go (qkinspect.twin.cluster): dask-cuda's LocalCUDACluster for cuda where it is installed
(a fake module here), the sweep engine's local cluster where it is not (its import blocked) and for the CPU, and a
GPU resource asked of a scheduler whose workers declare one."""

from __future__ import annotations

import sys
import types

import pytest

from qkinspect.twin.cluster import cluster_kind, twin_cluster
from qkinspect.twin.request import LIBRARY_NAMES


@pytest.fixture
def fake_dask_cuda(monkeypatch):
    from distributed import LocalCluster

    made: list[dict] = []

    def local_cuda_cluster(**options):
        made.append(options)
        return LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address="127.0.0.1:0")

    module = types.ModuleType("dask_cuda")
    module.LocalCUDACluster = local_cuda_cluster
    monkeypatch.setitem(sys.modules, "dask_cuda", module)
    return made


def test_without_dask_cuda_every_local_run_goes_to_the_local_cluster(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_cuda", None)  # `import dask_cuda` raises ImportError
    assert cluster_kind("cuda", None) == "local" and cluster_kind("cpu", None) == "local"
    assert cluster_kind("cuda", "tcp://127.0.0.1:8786") == "scheduler"


def test_with_dask_cuda_cuda_runs_go_to_its_local_cuda_cluster(fake_dask_cuda):
    assert cluster_kind("cuda", None) == "local-cuda"
    assert cluster_kind("cpu", None) == "local"  # the CPU cluster stays as it was
    assert cluster_kind("cuda", "tcp://127.0.0.1:8786") == "scheduler"
    with twin_cluster("cuda", None, 2, None, 5, LIBRARY_NAMES) as (client, threads, extra):
        assert client.submit(sum, [1, 2], pure=False).result() == 3
    assert threads == 1 and extra == {}
    assert fake_dask_cuda[0]["n_workers"] == 2 and fake_dask_cuda[0]["threads_per_worker"] == 1
    with twin_cluster("cuda", None, None, None, 5, LIBRARY_NAMES):
        pass
    assert "n_workers" not in fake_dask_cuda[1]  # one worker per GPU, dask-cuda's default


@pytest.mark.parametrize("resources, device, asks", [({"GPU": 1}, "cuda", True), (None, "cuda", False),
                                                     ({"GPU": 1}, "cpu", False)])
def test_a_scheduler_whose_workers_declare_a_gpu_gets_one_task_per_gpu(resources, device, asks):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, protocol="tcp://", host="127.0.0.1", threads_per_worker=2,
                      dashboard_address="127.0.0.1:0", resources=resources) as cluster:
        with twin_cluster(device, cluster.scheduler_address, None, None, 2, LIBRARY_NAMES) as (client, _, extra):
            assert extra == ({"resources": {"GPU": 1}} if asks else {})
            assert client.submit(sum, [2, 2], pure=False, **extra).result() == 4
