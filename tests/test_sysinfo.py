"""system.json's accelerator fields come from the device the records name (the backend's device services as recorded:
device.name, device.count), never a fixed "host CPU" placeholder."""

import dataclasses

from records_factory import make_result

from llmb.records import SYSTEM_FIELDS, DeviceRef, system_problems
from llmb.run import sysinfo


def test_the_cpu_plugin_s_named_device_is_the_accelerator():
    records = [make_result(device_name="AMD EPYC 9B14", precision=p).to_dict() for p in ("FP32", "BF16")]
    system = sysinfo.collect(records, [])
    assert system["accelerator_model_name"] == "AMD EPYC 9B14"
    assert system["accelerators_per_node"] == 1
    assert system["accelerator_type"] == "cpu"
    assert "host CPU" in system["accelerator_memory_capacity"]


def test_what_llmb_fills_in_system_json_is_the_typed_table_verify_holds_it_to():
    """One list of system.json's own fields (llmb.records.SYSTEM_FIELDS): every field the packager fills is in it,
    with the type it writes, so verify never fails an honest bundle's system.json nor misses a retyped field."""
    plugins = [{"name": "cpu", "distribution": "llmb", "version": "0"}]
    system = sysinfo.complete(sysinfo.collect([make_result().to_dict()], plugins), {})
    system.update(submitter="org", system_name="box", division="closed")  # as the packager completes it
    assert set(system) == set(SYSTEM_FIELDS) and system_problems(system) == []


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


# Issue 26: recorded variables are kept by name (an allow-list) and their values lose anything credential-shaped,
# whatever the form: a flag's value, a URL's user:password, a pair named like a secret, a generated key.

import json  # noqa: E402

import pytest  # noqa: E402

from llmb.spec.redact import value_for_record  # noqa: E402

SECRET_FORMS = [
    "--tpu_token SECRETvalue",
    "--auth-token=SECRETvalue",
    "-password SECRETvalue",
    "--api_key 'SECRETvalue'",
    "https://alice:SECRETpw@host.example/x",
    "alice:SECRETpw@host.example",
    "secret_key=SECRETvalue",
    "password: SECRETvalue",
    "credential=SECRETvalue",
    '{"token": "SECRET value"}',
    "Authorization: Bearer SECRETabcdefgh",
    "ghp_SECRETabcdefghijklmnopqrstuvwxyz0123",
    "k9SECRET3f8a1b2c4d5e6f7a8b9c0d1e2f",  # a generated key: letters and digits, nothing else
]
RECORDED = [
    "LIBTPU_INIT_ARGS",
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "OMP_PLACES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "XLA_FLAGS",
]


@pytest.mark.parametrize("name", RECORDED)
@pytest.mark.parametrize("form", SECRET_FORMS)
def test_a_credential_inside_a_recorded_variable_never_reaches_the_record(name, form):
    value = f"mlx5_0:1,{form},eth0" if name.startswith("NCCL") else f"--xla_flag=1 {form} --other=2"
    kept = sysinfo.run_environment({name: value})
    assert name in kept and "SECRET" not in kept[name], kept
    assert value_for_record(name, kept[name]) == kept[name]  # verify's own check of system.json passes it


BENIGN = {
    "LIBTPU_INIT_ARGS": "--xla_tpu_enable_data_parallel_all_reduce_opt=true --megascale_grpc_premap_memory_bytes=1024",
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
    "NCCL_SOCKET_IFNAME": "^docker0,lo",
    "OMP_PLACES": "{0:4},{4:4}",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,garbage_collection_threshold:0.6",
    "XLA_FLAGS": "--xla_gpu_enable_cublaslt_fp8_gemm=true --xla_gpu_all_reduce_combine_threshold_bytes=134217728",
    "CUDA_VISIBLE_DEVICES": "GPU-8f2a3b4c-1234-5678-9abc-def012345678,1",
}


def test_ordinary_values_are_kept_as_they_are_and_unlisted_names_are_not_kept():
    kept = sysinfo.run_environment({**BENIGN, "MY_APP_SETTING": "x", "HOME": "/somewhere"})
    assert kept == BENIGN, json.dumps(kept, indent=1)
