"""GPU sharing on a real NVIDIA machine, checked with the agent's own code; prints JSON.

    python bench/gpu_device_check.py [--mps-control PATH] [--clients 50,25] [--limit-mib 1024]

1. NVML: each GPU (index, UUID, name, memory, MIG mode now and pending) and its MIG instances
   as the agent finds them (scheduler/agent/gpumodes.py `mig_instances`). Reads only.
2. MPS, when nvidia-cuda-mps-control is found and a GPU without MIG is there: the agent's
   `MpsDaemons` (scheduler/agent/mps.py) start a control daemon for that GPU in a temporary
   pipe and log directory; a baseline client runs without MPS, then one client per
   `--clients` percentage at once, each with the environment the agent gives a task holding
   that share with a `--limit-mib` GPU memory limit. A client is the CUDA driver API through
   ctypes (no nvcc needed): it reports the devices and multiprocessors it sees, the memory
   `cuMemGetInfo` shows it, the result codes of one allocation under its limit and one over
   it (0 = success, 2 = out of memory), and how long a spin kernel (hand-written PTX that
   the driver compiles) took: beside the baseline's, that shows the share of the GPU it got
   (a measurement, not a pass/fail). The daemon's server list is read
   while they run; then the daemon is sent `quit` and must be gone.
3. The sampler: the agent's `GpuSampler` (scheduler/agent/gpus.py) reads the GPU before a
   client starts and while it holds its memory; NVML's own list of compute processes is
   printed beside it.
4. The device fence, on cgroup v2 as root: a cgroup is made under /sys/fs/cgroup for each
   case and given the agent's eBPF device program (scheduler/agent/devicebpf.py) with the
   rules the agent would write (`BASE_DEVICES`, `device_rules`, `gpu_device_nodes`): the
   GPU's own node and the control nodes ("own_gpu"), the control nodes without the GPU's node
   (a task that holds another GPU of the machine: "control_only"), and nothing ("no_gpu").
   A client runs in each, with no CUDA_VISIBLE_DEVICES: it must see the GPU only in the first.
   The cgroups are removed again. It also compares /dev/nvidiaN with NVML's minor numbers
   (the agent takes N as the NVML index).
5. The agent's own `Fence` (scheduler/agent/fence.py), last since it moves this process
   into a leaf cgroup as the agent does: it finds the cgroups, says what it enforces
   (`describe()`), and makes two task cgroups with the limits the agent gives a task holding
   GPU 0 and a neighbour holding no GPU; a client runs in each (no CUDA_VISIBLE_DEVICES):
   only the first may see the GPU. Both cgroups are ended and removed.
6. The agent itself (scheduler/agent/runtime.py `Agent`, its server a list of scripted
   answers as in tests/agent): it finds the GPUs through NVML, registers them, and starts
   three tasks of two owners at once: one holding GPU 0 whole, one holding none, and (where
   MPS is offered) one holding a quarter of GPU 0 with a GPU memory limit. Each runs the
   client as its own account; its output and its end are what the agent reported.
7. nvcc's version when it is installed (nothing here needs it).

It never changes MIG mode or instances, the compute mode or clocks, and never resets a GPU;
the only thing it starts is the one MPS control daemon, which it stops. Without NVML or a GPU
it prints `{"gpu": false, "reason": "no GPU: ..."}` and exits 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.agent.gpumodes import mig_instances  # noqa: E402  (Django-free)
from scheduler.agent.mps import MpsDaemons, find_control  # noqa: E402

MIB = 2**20
HOLD_SECONDS = 3.0  # how long each client keeps its context, so that they overlap
CLIENT_TIMEOUT = 120.0
SPIN_ITERATIONS = 100_000  # per thread: 1.6 ms on a whole H100 (measured 2026-11-28)
SPIN_BLOCKS = 1024  # of 256 threads
# A kernel every thread of which runs a chain of `iters` dependent FMAs, then stores its
# result: its time shows how much of the GPU a client gets. Plain PTX, compiled by the driver
# (no nvcc needed); sm_70 PTX runs on every GPU since Volta.
SPIN_PTX = r"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 out, .param .u32 iters)
{
    .reg .pred %p<2>;
    .reg .u32 %r<7>;
    .reg .f32 %f<2>;
    .reg .u64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iters];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    cvt.rn.f32.u32 %f1, %r5;
    mov.u32 %r6, 0;
LOOP:
    fma.rn.f32 %f1, %f1, 0f3F7FFFFF, 0f3F800000;
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd2, %rd2, %rd3;
    st.global.f32 [%rd2], %f1;
    ret;
}
"""
# One MPS (or plain) client: the CUDA driver API through ctypes. argv: bytes under the limit,
# bytes over it, seconds to hold the context, the spin kernel's iterations and blocks (of
# 256 threads). Each driver call's result code is reported (0: success, 2: out of memory).
CLIENT = r"""
import ctypes as c, json, os, sys, time
under, over, hold, iters, blocks = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]),
                                    int(sys.argv[4]), int(sys.argv[5]))
out = {"uid": os.getuid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "mps_limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "opens": {}}
for name in sorted(os.listdir("/dev")):
    if name.startswith("nvidia") and name[6:].isdigit():
        try:
            os.close(os.open("/dev/" + name, os.O_RDWR))
            out["opens"][name] = 0
        except OSError as exc:
            out["opens"][name] = exc.errno
try:
    cuda = c.CDLL("libcuda.so.1")
except OSError as exc:
    out["error"] = f"libcuda: {exc}"
    print(json.dumps(out))
    sys.exit(0)
out["init"] = cuda.cuInit(0)
n, dev, sms, ctx = c.c_int(), c.c_int(), c.c_int(), c.c_void_p()
out["device_count_result"] = cuda.cuDeviceGetCount(c.byref(n))
out["devices"] = n.value
if out["init"] == 0 and n.value > 0:
    cuda.cuDeviceGet(c.byref(dev), 0)
    out["context"] = cuda.cuDevicePrimaryCtxRetain(c.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    cuda.cuDeviceGetAttribute(c.byref(sms), 16, dev)  # MULTIPROCESSOR_COUNT
    out["multiprocessors"] = sms.value
    free, total = c.c_size_t(), c.c_size_t()
    cuda.cuMemGetInfo_v2(c.byref(free), c.byref(total))
    out["memory_free"], out["memory_total"] = free.value, total.value
    first, second = c.c_uint64(), c.c_uint64()
    out["alloc_under_limit"] = cuda.cuMemAlloc_v2(c.byref(first), c.c_size_t(under))
    out["alloc_over_limit"] = cuda.cuMemAlloc_v2(c.byref(second), c.c_size_t(over))
    module, function = c.c_void_p(), c.c_void_p()
    out["module_load"] = cuda.cuModuleLoadData(c.byref(module), c.c_char_p(PTX.encode()))
    if out["module_load"] == 0 and out["alloc_under_limit"] == 0 and under >= blocks * 1024:
        cuda.cuModuleGetFunction(c.byref(function), module, b"spin")
        count = c.c_uint32(iters)
        params = (c.c_void_p * 2)(c.cast(c.byref(first), c.c_void_p),
                                  c.cast(c.byref(count), c.c_void_p))
        began = time.perf_counter()
        out["launch"] = cuda.cuLaunchKernel(function, blocks, 1, 1, 256, 1, 1, 0, None,
                                            params, None)
        out["synchronize"] = cuda.cuCtxSynchronize()
        out["kernel_ms"] = round((time.perf_counter() - began) * 1000, 1)
    time.sleep(hold)
print(json.dumps(out))
""".replace("PTX.encode()", repr(SPIN_PTX) + ".encode()")


def nvml_devices(nvml: Any) -> list[dict[str, Any]]:
    """Every GPU as NVML describes it, with its MIG mode and instances (read only)."""
    found = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        item: dict[str, Any] = {
            "index": index,
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "memory": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        }
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
            item["mig_mode"] = {"current": int(current), "pending": int(pending)}
        except Exception as exc:  # not MIG-capable
            item["mig_mode"] = f"not supported: {exc}"
        try:
            item["compute_mode"] = int(nvml.nvmlDeviceGetComputeMode(handle))
        except Exception as exc:
            item["compute_mode"] = f"unknown: {exc}"
        item["mig"] = mig_instances(nvml, handle)
        found.append(item)
    return found


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvcc_version() -> str | None:
    nvcc = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)  # fmt: skip
    if nvcc is None:
        return None
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[:200]


def client_env(extra: dict[str, str]) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return {**env, **extra}


def start_client(env: dict[str, str], limit: int,
                 enter: Callable[[int], None] | None = None) -> subprocess.Popen[str]:  # fmt: skip
    """A client process; `enter(pid)` runs in it before exec (to move it into a cgroup, so
    that the cgroup's device program applies from its first open)."""
    argv = [limit // 2, limit * 2, HOLD_SECONDS, SPIN_ITERATIONS, SPIN_BLOCKS]
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, *map(str, argv)],
        env=client_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=(lambda: enter(os.getpid())) if enter is not None else None,
    )  # fmt: skip


def into(cgroup: Path) -> Callable[[int], None]:
    def enter(pid: int) -> None:
        (cgroup / "cgroup.procs").write_text(str(pid))

    return enter


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"error": "timed out", "stderr": err[-500:]}
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"error": "no result", "stdout": out[-500:]}
    result["exit_code"] = proc.returncode
    if err.strip():
        result["stderr"] = err[-500:]
    return result


def server_list(daemons: MpsDaemons, index: int) -> str:
    env = daemons.daemon_env(index)
    done = subprocess.run([daemons.control], input="get_server_list\n", text=True, env=env,
                          capture_output=True, timeout=30)  # fmt: skip
    return (done.stdout + done.stderr).strip()


def tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def mps_check(control: str | None, devices: list[dict[str, Any]], percentages: list[int],
              limit: int) -> dict[str, Any]:  # fmt: skip
    """Start the agent's MPS daemon on the first GPU without MIG and run clients through it."""
    if control is None:
        return {"control": None, "reason": "no nvidia-cuda-mps-control on PATH"}
    plain = [d for d in devices if not d["mig"]]
    if not plain:
        return {"control": control, "reason": "every GPU is in MIG mode: MPS not tried"}
    gpu = plain[0]
    folder = Path(tempfile.mkdtemp(prefix="berth-mps-check-"))
    daemons = MpsDaemons(control, folder / "pipe", folder / "log")
    report: dict[str, Any] = {"control": control, "gpu": gpu["index"], "limit_mib": limit // MIB}
    try:
        report["baseline"] = finish(start_client({"CUDA_VISIBLE_DEVICES": gpu["uuid"]}, limit))
        report["daemon_started"] = daemons.ensure({gpu["index"]: gpu["uuid"]}) == [gpu["index"]]
        report["daemon_pid"] = daemons.pid(gpu["index"])
        if not report["daemon_started"]:
            report["daemon_log"] = tail(daemons.log_dir(gpu["index"]) / "control.log")
            return report
        clients = []
        for percent in percentages:
            env = daemons.client_env(gpu["index"], percent / 100, limit)
            clients.append((env, start_client({**env, "CUDA_VISIBLE_DEVICES": gpu["uuid"]},
                                              limit)))  # fmt: skip
        time.sleep(HOLD_SECONDS / 2)
        report["server_list_while_running"] = server_list(daemons, gpu["index"])
        report["clients"] = [{"env": env, **finish(proc)} for env, proc in clients]
    finally:
        daemons.stop_all(set())
        report["daemon_stopped"] = daemons.pid(gpu["index"]) is None
        report["control_log"] = tail(daemons.log_dir(gpu["index"]) / "control.log")
        report["server_log"] = tail(daemons.log_dir(gpu["index"]) / "server.log")
        if report["daemon_stopped"]:  # else its pipes stay for a person to look at
            shutil.rmtree(folder, ignore_errors=True)
    return report


def sampler_check(devices: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The agent's sampler before a client and while it holds `limit // 2` bytes."""
    from scheduler.agent.gpus import GpuSampler

    gpu = devices[0]
    sampler = GpuSampler([{"index": gpu["index"], "memory": gpu["memory"]}], fake=False)
    report: dict[str, Any] = {"before": sampler.sample([gpu["index"]])}
    proc = start_client({"CUDA_VISIBLE_DEVICES": gpu["uuid"]}, limit)
    try:
        time.sleep(HOLD_SECONDS / 2 + 1.0)
        report["while_held"] = sampler.sample([gpu["index"]])
        try:
            nvml = sampler._nvml
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu["index"])
            report["nvml_processes"] = [
                {"pid": int(p.pid), "used": int(p.usedGpuMemory or 0)}
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ]
        except Exception as exc:
            report["nvml_processes"] = f"unavailable: {exc}"
    finally:  # (the client is waited for whatever the sampler did)
        report["client"] = finish(proc)
        report["client_pid"] = proc.pid
        sampler.close()
    return report


def fence_check(devices: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The agent's eBPF device program on a cgroup per case; a client in each."""
    from scheduler.agent import devicebpf
    from scheduler.agent.cgroups import (
        BASE_DEVICES,
        GPU_CONTROL_NODES,
        device_rules,
        gpu_device_nodes,
    )
    from scheduler.agent.fence import nvidia_nodes

    nodes = nvidia_nodes()
    report: dict[str, Any] = {"nodes": nodes}
    root = Path("/sys/fs/cgroup")
    if os.geteuid() != 0 or not (root / "cgroup.controllers").exists():
        report["reason"] = "needs root and cgroup v2 at /sys/fs/cgroup"
        return report
    gpu = devices[0]["index"]
    cases = {
        "own_gpu": device_rules(gpu_device_nodes([gpu], nodes)),
        "control_only": device_rules(p for p in GPU_CONTROL_NODES if os.path.exists(p)),
        "no_gpu": [],
    }
    top = root / "berth-gpu-check"
    try:
        top.mkdir(exist_ok=True)
        for case, rules in cases.items():
            group = top / case
            group.mkdir(exist_ok=True)
            try:
                devicebpf.attach(group, (*BASE_DEVICES, *rules))
                report[case] = {"rules": rules, "programs": devicebpf.attached(group),
                                **finish(start_client({}, limit, into(group)))}  # fmt: skip
            except OSError as exc:
                report[case] = {"rules": rules, "error": str(exc)}
            finally:
                try:
                    group.rmdir()
                except OSError as exc:  # (a client still in it: the other cases still run)
                    report[f"{case}_left"] = str(exc)
    except OSError as exc:
        report["error"] = str(exc)
    finally:
        try:
            top.rmdir()
        except OSError:
            pass
    return report


def agent_fence_check(devices: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The agent's Fence as `run_agent` sets it up: a GPU task and a neighbour without one."""
    from scheduler.agent.fence import Fence, usage_report

    fence = Fence(mode="required", base_name="berth-gpu-check")
    fence.setup()
    report: dict[str, Any] = {"describe": fence.describe()}
    if fence.hierarchy is None:
        return report
    order = {"resources": {"memory": 4 * 2**30, "cpu": 2000}}
    for name, gpus in (("gpu-task", [devices[0]["index"]]), ("neighbour", [])):
        limits = fence.limits(order, gpus)
        try:
            fence.create(name, limits)
            result = finish(start_client({}, limit, functools.partial(fence.add, name)))
        except OSError as exc:
            result = {"error": str(exc)}
        ended = fence.end(name)
        report[name] = {"devices": list(limits.devices), **result,
                        "ended": usage_report(ended.usage) if ended else None}  # fmt: skip
    fence.close()
    report["left"] = fence.hierarchy.names()
    return report


def agent_tasks_check(control: str | None, limit: int) -> dict[str, Any]:
    """Three tasks started by a real `Agent` (scripted server) on this machine's GPUs."""
    from scheduler.agent.runtime import Agent

    class ScriptedAgent(Agent):
        def __init__(self, work: Path, **kw: Any) -> None:
            super().__init__("http://server.invalid", "join", name="gpu-check", work_dir=work,
                             **kw)  # fmt: skip
            self.token = "t"
            self.sent: list[tuple[str, dict[str, Any]]] = []
            self.answers: list[dict[str, Any]] = []

        def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
            self.sent.append((path, body))
            if path == "report/":
                return self.answers.pop(0) if self.answers else {}
            if path == "register/":
                return {"token": "t2", "lease_seconds": 0.05, "kill_grace_seconds": 0.5}
            return {}

        def _lease_post(self, body: dict[str, Any], auth: str) -> dict[str, Any]:
            time.sleep(0.05)
            return {}

    work = Path(tempfile.mkdtemp(prefix="berth-gpu-agent-", dir="/var/tmp"))
    work.chmod(0o755)
    client = work / "client.py"
    client.write_text(CLIENT)
    client.chmod(0o644)
    sharing = ("mps",) if control else ()
    agent = ScriptedAgent(work / "agent", gpu_sharing=sharing, mps_control=control)
    report: dict[str, Any] = {}
    try:
        agent.prepare()
        agent.register()
        registered = [b for p, b in agent.sent if p == "register/"][-1]
        report["registered"] = {k: registered.get(k) for k in ("devices", "gpu_sharing",
                                                               "enforcement")}  # fmt: skip
        argv = f"python3 {client} {limit // 2} {limit * 2} 0.5 {SPIN_ITERATIONS} {SPIN_BLOCKS}"
        resources = {"cpu": 1000, "memory": 2 * 2**30}

        def order(task: int, owner: str, devices: list[int], **extra: Any) -> dict[str, Any]:
            return {"id": task, "attempt": 0, "job_id": task, "job_name": f"check-{task}",
                    "group": "main", "index": 0, "command": argv, "owner": owner, "env": {},
                    "devices": devices, "walltime": 600, "resources": resources,
                    **extra}  # fmt: skip

        orders = [order(1, "alice", [0]), order(2, "bob", [])]
        if "mps" in (registered.get("gpu_sharing") or []):
            orders.append(order(3, "bob", [0], shares=[0.25], gpu_memory=limit))
        agent.answers = [{"start": orders}]
        deadline = time.monotonic() + 120
        ended: dict[int, dict[str, Any]] = {}
        while len(ended) < len(orders) and time.monotonic() < deadline:
            agent.step()
            for path, body in agent.sent:
                if path == "report/":
                    ended.update({t["id"]: t for t in body["tasks"] if t["state"] != "Running"})
            time.sleep(0.1)
        agent.step()
        for task in orders:
            text = "".join(b["data"] for p, b in agent.sent if p == f"tasks/{task['id']}/log/")
            lines = [line for line in text.splitlines() if line.startswith("{")]
            try:
                seen = json.loads(lines[-1]) if lines else {"output": text[-500:]}
            except ValueError:
                seen = {"output": text[-500:]}
            end = ended.get(task["id"], {})
            report[f"task{task['id']}"] = {
                "owner": task["owner"], "devices": task["devices"],
                "shares": task.get("shares", []), "state": end.get("state"),
                "exit_code": end.get("exit_code"), "message": end.get("message"), **seen,
            }  # fmt: skip
    except Exception as exc:
        report["error"] = f"{exc.__class__.__name__}: {exc}"
    finally:
        try:
            agent._shut_down(None)  # (what its run loop does when it stops)
        except Exception as exc:
            report["shutdown"] = f"{exc.__class__.__name__}: {exc}"
        shutil.rmtree(work, ignore_errors=True)
    return report


def minors(nvml: Any, devices: list[dict[str, Any]]) -> dict[int, Any]:
    found: dict[int, Any] = {}
    for item in devices:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(item["index"])
            found[item["index"]] = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except Exception as exc:
            found[item["index"]] = f"unknown: {exc}"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mps-control", default=None, help="nvidia-cuda-mps-control's path")
    parser.add_argument("--clients", default="50,25", help="thread percentages, one per client")
    parser.add_argument("--limit-mib", type=int, default=1024, help="each client's GPU memory")
    parser.add_argument(
        "--agent-tasks",
        action="store_true",
        help="also start tasks through a real agent (as root: task accounts)",
    )
    args = parser.parse_args(argv)
    percentages = [max(1, min(100, int(p))) for p in args.clients.split(",") if p.strip()]
    report: dict[str, Any] = {"gpu": False}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        report["reason"] = f"no GPU: NVML is not available ({exc.__class__.__name__}: {exc})"
        print(json.dumps(report, indent=2))
        return 0
    try:
        report["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        report["devices"] = nvml_devices(pynvml)
        report["minor_numbers"] = minors(pynvml, report["devices"])
    finally:
        pynvml.nvmlShutdown()
    if not report["devices"]:
        report["reason"] = "no GPU: NVML found no device"
        print(json.dumps(report, indent=2))
        return 0
    report["gpu"] = True
    report["nvcc"] = nvcc_version()
    for part, check in (("sampler", sampler_check), ("fence", fence_check)):
        try:
            report[part] = check(report["devices"], args.limit_mib * MIB)
        except Exception as exc:  # one part failing must not hide the others
            report[part] = {"error": f"{exc.__class__.__name__}: {exc}"}
    report["mps"] = mps_check(find_control(args.mps_control), report["devices"], percentages,
                              args.limit_mib * MIB)  # fmt: skip
    try:
        report["agent_fence"] = agent_fence_check(report["devices"], args.limit_mib * MIB)
    except Exception as exc:
        report["agent_fence"] = {"error": f"{exc.__class__.__name__}: {exc}"}
    if args.agent_tasks:
        report["agent_tasks"] = agent_tasks_check(find_control(args.mps_control),
                                                  args.limit_mib * MIB)  # fmt: skip
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
