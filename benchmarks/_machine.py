"""What machine a benchmark ran on, shared by the benchmark scripts: the CPU's name and the feature flags that decide
which kernels run (AVX2, AVX-512, its bf16 and fp16 extensions, AMX), so that a figure copied from a run names them."""
import os, platform

SPEED_FLAGS = ('avx2', 'avx512f', 'avx512_bf16', 'avx512_fp16', 'amx_tile')  # printed when present, in this order


def cpu_name() -> str:
    "The CPU's model name (/proc/cpuinfo; platform.processor() elsewhere)."
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'): return line.split(':', 1)[1].strip()
    except OSError: pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set:
    "The CPU's feature flags from /proc/cpuinfo (empty where it is missing)."
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('flags'): return set(line.split(':', 1)[1].split())
    except OSError: pass
    return set()


def cpu_line(threads:int) -> str:
    "One line for a benchmark's header: 'CPU: <name> (<flags>), <threads> thread(s) of <n> logical CPUs'."
    flags = [f for f in SPEED_FLAGS if f in cpu_flags()]
    return f"CPU: {cpu_name()}{' (' + ', '.join(flags) + ')' if flags else ''}, {threads} thread{'s' * (threads != 1)} of {os.cpu_count()} logical CPUs"
