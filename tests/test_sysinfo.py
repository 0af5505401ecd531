"""system.json's accelerator fields come from the device the records name (the backend's device services as recorded:
device.name, device.count), never a fixed "host CPU" placeholder."""

import dataclasses

from records_factory import make_result

from llmb import sysinfo
from llmb.records import DeviceRef


def test_the_cpu_plugin_s_named_device_is_the_accelerator():
    records = [make_result(device_name="AMD EPYC 9B14", precision=p).to_dict() for p in ("FP32", "BF16")]
    system = sysinfo.collect(records, [])
    assert system["accelerator_model_name"] == "AMD EPYC 9B14"
    assert system["accelerators_per_node"] == 1
    assert system["accelerator_type"] == "cpu"
    assert "host CPU" in system["accelerator_memory_capacity"]


def test_a_multi_device_job_counts_its_devices_per_node():
    # Records as a CUDA plugin would write them (no GPU here: the record is made, not run).
    base = make_result(world_size=8, nodes=2, parallel="ddp")
    record = dataclasses.replace(
        base, device=DeviceRef(type="cuda", spec="cuda", name="NVIDIA H100 80GB HBM3", count=4)
    )
    system = sysinfo.collect([record.to_dict()], [])
    assert system["accelerator_model_name"] == "NVIDIA H100 80GB HBM3"
    assert system["accelerators_per_node"] == 4 and system["number_of_nodes"] == 2
    assert system["accelerator_type"] == "cuda"


def test_accelerator_memory_is_the_recorded_device_memory_not_the_packaging_hosts():
    # Records as a CUDA plugin would write them (no GPU here: the record is made, not run); the packaging host has no
    # GPU, so any figure must come from the records.
    base = make_result()
    h100 = DeviceRef(type="cuda", spec="cuda", name="NVIDIA H100 80GB HBM3", count=1, memory_bytes=80 * 2**30)
    system = sysinfo.collect([dataclasses.replace(base, device=h100).to_dict()], [])
    assert system["accelerator_memory_capacity"] == "80.0 GiB"
    unknown = dataclasses.replace(h100, memory_bytes=None)
    system = sysinfo.collect([dataclasses.replace(base, device=unknown).to_dict()], [])
    assert system["accelerator_memory_capacity"] == "unknown"


def test_a_backend_reports_its_device_memory_into_the_record(register_backend, tmp_path):
    from conftest import run_record

    from llmb import CpuBackend

    class BigMemory(CpuBackend):
        name = "bigmemory"

        def device_memory_bytes(self, device):
            return 96 * 2**30

    register_backend(BigMemory())
    record = run_record(tmp_path, "--plugin", "bigmemory", "--device", "cpu")
    assert record["device"]["memory_bytes"] == 96 * 2**30
    assert "memory_bytes" not in run_record(tmp_path / "cpu", "--plugin", "cpu", "--device", "cpu")["device"]
