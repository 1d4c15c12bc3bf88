"""Peak extra memory of one call, shared by the benchmark scripts (run each measurement in a fresh process).

On CUDA: torch.cuda.max_memory_allocated() minus the memory allocated before the call. On Linux CPUs: the kernel's
peak-RSS counter is reset to the current RSS (writing 5 to /proc/self/clear_refs), and the peak (VmHWM) minus the
resident size before the call is the extra memory the call needed. Elsewhere: the growth of getrusage's ru_maxrss.
"""
import resource, sys


def status_kb(field):
    "A field of /proc/self/status in kB (VmRSS, VmHWM), or None where /proc is missing."
    try:
        for line in open('/proc/self/status'):
            if line.startswith(field + ':'): return int(line.split()[1])
    except OSError: return None


def maxrss_kb():
    "Peak RSS of this process in kB from getrusage (bytes on macOS, kB on Linux)."
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r // 1024 if sys.platform == 'darwin' else r


def peak_extra_mb(call, device='cpu'):
    "Run `call()` once; return (extra peak memory in MB, the method used)."
    if str(device).startswith('cuda'):
        import torch
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20, 'cuda.max_memory_allocated'
    try:
        with open('/proc/self/clear_refs', 'w') as f: f.write('5')  # peak RSS := current RSS
        reset = True
    except OSError: reset = False
    base = status_kb('VmRSS') if reset else maxrss_kb()
    call()
    top = status_kb('VmHWM') if reset else maxrss_kb()
    return max(top - base, 0) / 1024, 'peak RSS (VmHWM) - RSS before' if reset else 'ru_maxrss delta'
