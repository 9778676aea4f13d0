/*
 * simulated_nvml.c - a fake libnvidia-ml.so.1 whose answers come from a text file.
 *
 * Why NVML is faked: the exporter must be tested, demonstrated and benchmarked on machines without
 * an NVIDIA GPU or driver. Faking the C library (not the Python binding) means the real `pynvml`
 * binding is exercised unchanged: its ctypes struct layouts, its two-call process listing, its
 * error classes. A real GPU host is checked separately by tests/gpu/check_real_gpu.sh.
 *
 * The state file is named by env SIMULATED_NVML_STATE and re-read on every call, so a test or the
 * simulator changes answers live (write a temporary file and rename it over the old one). No
 * variable, or no file, means a host with 0 GPUs. Lines (unknown lines and '#' comments ignored):
 *
 *   gpu <index> <uuid> <name-without-spaces> <memory_total_bytes> <memory_used_bytes>
 *       <gpu_util_percent> <mem_util_percent>          (one line; written by the simulator)
 *   proc <gpu_index> <pid> <used_memory_bytes>          (written by the simulator)
 *   reserved <index> <bytes>        memory the driver reserves (v2 memory info; v1 "used" adds it)
 *   pcie <index> <rx_kb_per_s>      PCIe RX throughput (default 0 KB/s)
 *   init_error <nvml_return>        nvmlInit fails, e.g. 18 = LIB_RM_VERSION_MISMATCH
 *   lost <index>                    every query on that GPU returns 15 = GPU_IS_LOST
 *   not_supported <function> [idx]  that function returns 3 = NOT_SUPPORTED (on one GPU or all)
 *   error <function> <code> [idx]   that function returns <code>, e.g. 4 = NO_PERMISSION
 *   hang <function> <seconds>       that function sleeps first (a call stuck in the driver)
 *   crash <function>                that function raises SIGSEGV (seen in the field: nvitop#139)
 *   stride32                        process records use the 32-byte v3 layout of R535 drivers,
 *                                   which the binding reads with a 24-byte stride (nvitop#79)
 *   mig_mode <index> <current> <pending>   MIG mode (0/1); no line: NOT_SUPPORTED (not MIG-capable)
 *   mig <index> <uuid> <gpu_instance> <compute_instance> <memory_total_bytes> <memory_used_bytes>
 *       <profile>                   one MIG device of GPU <index>, in MIG index order
 *   mig_proc <mig_uuid> <pid> <used_memory_bytes>   a process on that MIG device; the full
 *                                   GPU's listing includes it too, as real drivers do for root
 *
 * GPU health (see the "health" block below):
 *   xid <index> <code>              a critical Xid event on that GPU; every line is one event,
 *                                   delivered once by nvmlEventSetWait in file order (the library
 *                                   remembers how many it delivered per GPU, so keep old lines)
 *   ecc <index> <uncorrected_volatile>           volatile uncorrected ECC count (default 0)
 *   retired_pending <index> <0|1>                pages waiting for retirement (default 0)
 *   remap <index> <corr> <uncorr> <pending> <failure>  remapped rows (default all 0)
 *   throttle <index> <reasons_bitmask>           clocks event reasons (default 0 = none)
 *   pcie_link <index> <gen> <max_gen> <width> <max_width>  (default gen 5/5, width 16/16)
 *
 * A missing symbol cannot be toggled at run time: build with -DNO_V3 (and -DNO_V2) for drivers
 * without nvmlDeviceGetComputeRunningProcesses_v3 (_v2), -DNO_MIG for drivers before R450 (no
 * MIG calls at all), and -DNO_EVENTS for a driver without the event API (nvmlEventSetCreate and
 * friends). exporter_tooling/fakenvml/build.py builds the variants.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

#define MAX_GPUS 64
#define MAX_PROCS 512
#define MAX_FAULTS 32
#define MAX_XIDS 256
#define FN_LEN 64
#define MAX_MIGS 64
#define MAX_MIGS_PER_GPU 7 /* what nvmlDeviceGetMaxMigDeviceCount says on A100/H100 */

typedef struct nvmlDevice_st {
    unsigned int index;
} *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

/* The record R535-era drivers wrote for _v3: the binding's 24-byte stride misreads it. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_r535_t;

struct gpu {
    int present, lost;
    char uuid[96], name[96];
    unsigned long long total, used, reserved, pcie_rx_kb;
    unsigned int util_gpu, util_mem;
};

/* One GPU's health answers (the "health" block); all zero means healthy with no link read. */
struct health {
    int link_set;
    unsigned long long ecc_uncorrected, throttle;
    unsigned int retired_pending, remap[4], link[4];
};

struct xid {
    unsigned int gpu, code;
};

struct proc {
    unsigned int gpu, pid;
    unsigned long long used;
};

struct fault {
    char fn[FN_LEN];
    int index; /* -1: every GPU */
    double seconds;
    nvmlReturn_t code;
};

/* A MIG device: its parent GPU, ids and memory; "procs" with gpu = its slot in "migs". */
struct mig {
    int gpu;
    char uuid[96], profile[64];
    unsigned int gpu_instance, compute_instance;
    unsigned long long total, used;
};

struct state {
    int gpu_count, proc_count, init_error, stride32;
    int error_count, hang_count, crash_count;
    int xid_count;
    struct health health[MAX_GPUS];
    struct xid xids[MAX_XIDS];
    struct gpu gpus[MAX_GPUS];
    struct proc procs[MAX_PROCS];
    struct fault error[MAX_FAULTS], hang[MAX_FAULTS], crash[MAX_FAULTS];
    /* MIG: mode per GPU (-1: not MIG-capable), devices, and the processes on them */
    int mig_current[MAX_GPUS], mig_pending[MAX_GPUS], mig_count, mig_proc_count;
    struct mig migs[MAX_MIGS];
    struct proc mig_procs[MAX_PROCS];
};

static struct state st;
static struct nvmlDevice_st handles[MAX_GPUS];
/* MIG handles are distinct from full-GPU handles; index = slot in st.migs */
static struct nvmlDevice_st mig_handles[MAX_MIGS];
static int initialized;

static int valid_index(long index) { return index >= 0 && index < MAX_GPUS; }

static void add_fault(struct fault *list, int *count, const char *fn, int index, double seconds,
                      nvmlReturn_t code) {
    if (*count >= MAX_FAULTS) return;
    snprintf(list[*count].fn, FN_LEN, "%s", fn);
    list[*count].index = index;
    list[*count].seconds = seconds;
    list[*count].code = code;
    (*count)++;
}

static void parse_gpu(const char *line) {
    long index;
    struct gpu g;
    memset(&g, 0, sizeof g);
    if (sscanf(line, "gpu %ld %95s %95s %llu %llu %u %u", &index, g.uuid, g.name, &g.total,
               &g.used, &g.util_gpu, &g.util_mem) != 7 || !valid_index(index))
        return;
    g.present = 1;
    g.lost = st.gpus[index].lost;
    g.reserved = st.gpus[index].reserved;
    g.pcie_rx_kb = st.gpus[index].pcie_rx_kb;
    st.gpus[index] = g;
    if (index + 1 > st.gpu_count) st.gpu_count = (int)index + 1;
}

/* MIG lines; returns 1 when the line was one. */
static int parse_mig_line(const char *line) {
    long index;
    int current, pending;
    char uuid[96];
    struct mig m;
    struct proc p;
    memset(&m, 0, sizeof m);
    if (sscanf(line, "mig_mode %ld %d %d", &index, &current, &pending) == 3) {
        if (valid_index(index)) st.mig_current[index] = current, st.mig_pending[index] = pending;
    } else if (sscanf(line, "mig_proc %95s %u %llu", uuid, &p.pid, &p.used) == 3) {
        for (int i = 0; i < st.mig_count; i++)
            if (strcmp(st.migs[i].uuid, uuid) == 0 && st.mig_proc_count < MAX_PROCS) {
                p.gpu = (unsigned int)i;
                st.mig_procs[st.mig_proc_count++] = p;
            }
    } else if (sscanf(line, "mig %ld %95s %u %u %llu %llu %63s", &index, m.uuid, &m.gpu_instance,
                      &m.compute_instance, &m.total, &m.used, m.profile) == 7) {
        if (valid_index(index) && st.mig_count < MAX_MIGS) {
            m.gpu = (int)index;
            st.migs[st.mig_count++] = m;
        }
    } else {
        return 0;
    }
    return 1;
}

static int parse_health(const char *line);

static void parse_line(const char *line) {
    char fn[FN_LEN];
    long index = -1;
    int code;
    unsigned long long value;
    double seconds;
    struct proc p;
    if (strncmp(line, "mig", 3) == 0 && parse_mig_line(line)) {
    } else if (strncmp(line, "gpu ", 4) == 0) {
        parse_gpu(line);
    } else if (sscanf(line, "proc %u %u %llu", &p.gpu, &p.pid, &p.used) == 3) {
        if (st.proc_count < MAX_PROCS) st.procs[st.proc_count++] = p;
    } else if (sscanf(line, "reserved %ld %llu", &index, &value) == 2 && valid_index(index)) {
        st.gpus[index].reserved = value;
    } else if (sscanf(line, "pcie %ld %llu", &index, &value) == 2 && valid_index(index)) {
        st.gpus[index].pcie_rx_kb = value;
    } else if (strncmp(line, "init_error ", 11) == 0) {
        st.init_error = atoi(line + 11);
    } else if (sscanf(line, "lost %ld", &index) == 1 && valid_index(index)) {
        st.gpus[index].lost = 1;
    } else if (sscanf(line, "not_supported %63s %ld", fn, &index) >= 1) {
        add_fault(st.error, &st.error_count, fn, (int)index, 0, NVML_ERROR_NOT_SUPPORTED);
    } else if (sscanf(line, "error %63s %d %ld", fn, &code, &index) >= 2) {
        add_fault(st.error, &st.error_count, fn, (int)index, 0, code);
    } else if (sscanf(line, "hang %63s %lf", fn, &seconds) == 2) {
        add_fault(st.hang, &st.hang_count, fn, -1, seconds, 0);
    } else if (sscanf(line, "crash %63s", fn) == 1) {
        add_fault(st.crash, &st.crash_count, fn, -1, 0, 0);
    } else if (strncmp(line, "stride32", 8) == 0) {
        st.stride32 = 1;
    } else {
        parse_health(line);
    }
}

/* --- health: Xid events, ECC, retired pages, remapped rows, throttle, PCIe link ---------- */

static int parse_health(const char *line) {
    long index;
    unsigned int a, b, c, d;
    unsigned long long value;
    if (sscanf(line, "xid %ld %u", &index, &a) == 2 && valid_index(index)) {
        if (st.xid_count < MAX_XIDS) {
            st.xids[st.xid_count].gpu = (unsigned int)index;
            st.xids[st.xid_count++].code = a;
        }
    } else if (sscanf(line, "ecc %ld %llu", &index, &value) == 2 && valid_index(index)) {
        st.health[index].ecc_uncorrected = value;
    } else if (sscanf(line, "retired_pending %ld %u", &index, &a) == 2 && valid_index(index)) {
        st.health[index].retired_pending = a;
    } else if (sscanf(line, "remap %ld %u %u %u %u", &index, &a, &b, &c, &d) == 5 &&
               valid_index(index)) {
        st.health[index].remap[0] = a, st.health[index].remap[1] = b;
        st.health[index].remap[2] = c, st.health[index].remap[3] = d;
    } else if (sscanf(line, "throttle %ld %llu", &index, &value) == 2 && valid_index(index)) {
        st.health[index].throttle = value;
    } else if (sscanf(line, "pcie_link %ld %u %u %u %u", &index, &a, &b, &c, &d) == 5 &&
               valid_index(index)) {
        st.health[index].link_set = 1;
        st.health[index].link[0] = a, st.health[index].link[1] = b;
        st.health[index].link[2] = c, st.health[index].link[3] = d;
    } else {
        return 0;
    }
    return 1;
}

/* Re-read the whole state on every call: the file is tiny and answers must change live. */
static void load_state(void) {
    const char *path = getenv("SIMULATED_NVML_STATE");
    char line[512];
    FILE *f;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < MAX_GPUS; i++) st.mig_current[i] = st.mig_pending[i] = -1;
    if (path == NULL || (f = fopen(path, "r")) == NULL) return;
    while (fgets(line, sizeof line, f) != NULL) parse_line(line);
    fclose(f);
    /* A "gpu" line may follow its "lost"/"reserved" line; gaps in indices are not GPUs. */
    for (int i = 0; i < st.gpu_count; i++)
        if (!st.gpus[i].present) st.gpu_count = i;
}

static const struct fault *find_fault(const struct fault *list, int count, const char *fn,
                                      int index) {
    for (int i = 0; i < count; i++)
        if (strcmp(list[i].fn, fn) == 0 && (list[i].index < 0 || list[i].index == index))
            return &list[i];
    return NULL;
}

static void sleep_seconds(double seconds) {
    struct timespec left = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&left, &left) != 0) {
    }
}

/* Common entry of every call: load the state, then apply the faults the test asked for. */
static nvmlReturn_t enter(const char *fn, int index) {
    const struct fault *hang, *error;
    load_state();
    if (find_fault(st.crash, st.crash_count, fn, index) != NULL) raise(SIGSEGV);
    hang = find_fault(st.hang, st.hang_count, fn, index);
    if (hang != NULL) sleep_seconds(hang->seconds);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    error = find_fault(st.error, st.error_count, fn, index);
    return error != NULL ? error->code : NVML_SUCCESS;
}

/* Entry of a per-device call: also checks the handle and the out pointer, applies "lost". */
static nvmlReturn_t enter_device(const char *fn, nvmlDevice_t device, const void *out,
                                 struct gpu **gpu) {
    nvmlReturn_t ret;
    if (device == NULL || device < handles || device >= handles + MAX_GPUS || out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    ret = enter(fn, (int)device->index);
    if (ret != NVML_SUCCESS) return ret;
    if ((int)device->index >= st.gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = &st.gpus[device->index];
    return (*gpu)->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static int is_mig_handle(nvmlDevice_t device) {
    return device >= mig_handles && device < mig_handles + MAX_MIGS;
}

/* Entry of a call on a MIG handle: faults and "lost" are those of its parent GPU. */
static nvmlReturn_t enter_mig(const char *fn, nvmlDevice_t device, const void *out,
                              struct mig **mig) {
    nvmlReturn_t ret;
    if (!is_mig_handle(device) || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    load_state(); /* to find the parent; enter() reloads it with the faults applied */
    if ((int)device->index >= st.mig_count) return NVML_ERROR_INVALID_ARGUMENT;
    ret = enter(fn, st.migs[device->index].gpu);
    if (ret != NVML_SUCCESS) return ret;
    if ((int)device->index >= st.mig_count) return NVML_ERROR_INVALID_ARGUMENT;
    *mig = &st.migs[device->index];
    return st.gpus[(*mig)->gpu].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    initialized = 1;
    enter("nvmlInitWithFlags", -1);
    if (st.init_error != 0) {
        initialized = 0;
        return st.init_error;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        default: return "Simulated NVML error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlSystemGetDriverVersion", -1);
    return ret != NVML_SUCCESS ? ret : copy_string("550.90.07-simulated", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlSystemGetNVMLVersion", -1);
    return ret != NVML_SUCCESS ? ret : copy_string("12.550.90.07-simulated", version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t ret = enter("nvmlDeviceGetCount_v2", -1);
    if (ret != NVML_SUCCESS) return ret;
    *count = (unsigned int)st.gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t ret = enter("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (ret != NVML_SUCCESS) return ret;
    if (device == NULL || (int)index >= st.gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    handles[index].index = index;
    *device = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static nvmlReturn_t mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length);
static nvmlReturn_t mig_name(nvmlDevice_t device, char *name, unsigned int length);

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct gpu *gpu;
    nvmlReturn_t ret;
    if (is_mig_handle(device)) return mig_uuid(device, uuid, length);
    ret = enter_device("nvmlDeviceGetUUID", device, uuid, &gpu);
    return ret != NVML_SUCCESS ? ret : copy_string(gpu->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct gpu *gpu;
    nvmlReturn_t ret;
    if (is_mig_handle(device)) return mig_name(device, name, length);
    ret = enter_device("nvmlDeviceGetName", device, name, &gpu);
    return ret != NVML_SUCCESS ? ret : copy_string(gpu->name, name, length);
}

static unsigned long long free_bytes(const struct gpu *gpu) {
    unsigned long long held = gpu->used + gpu->reserved;
    return held > gpu->total ? 0 : gpu->total - held;
}

/* v1 has no "reserved": like real drivers, its "used" includes the reserved memory. */
static nvmlReturn_t mig_memory(const char *fn, nvmlDevice_t device, unsigned long long *total,
                               unsigned long long *free, unsigned long long *used);

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct gpu *gpu;
    nvmlReturn_t ret;
    if (is_mig_handle(device) && memory != NULL)
        return mig_memory("nvmlDeviceGetMemoryInfo", device, &memory->total, &memory->free,
                          &memory->used);
    ret = enter_device("nvmlDeviceGetMemoryInfo", device, memory, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    memory->total = gpu->total;
    memory->free = free_bytes(gpu);
    memory->used = gpu->used + gpu->reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct gpu *gpu;
    nvmlReturn_t ret;
    if (is_mig_handle(device) && memory != NULL) {
        if (memory->version != NVML_MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        memory->reserved = 0;
        return mig_memory("nvmlDeviceGetMemoryInfo_v2", device, &memory->total, &memory->free,
                          &memory->used);
    }
    ret = enter_device("nvmlDeviceGetMemoryInfo_v2", device, memory, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (memory->version != NVML_MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = gpu->total;
    memory->reserved = gpu->reserved;
    memory->free = free_bytes(gpu);
    memory->used = gpu->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetUtilizationRates", device, utilization, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    utilization->gpu = gpu->util_gpu;
    utilization->memory = gpu->util_mem;
    return NVML_SUCCESS;
}

/* counter 1 = NVML_PCIE_UTIL_RX_BYTES; NVML reports KB/s. TX is not simulated: 0. */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *value) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetPcieThroughput", device, value, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *value = counter == 1 ? (unsigned int)gpu->pcie_rx_kb : 0;
    return NVML_SUCCESS;
}

static int mig_records(nvmlDevice_t device, int whole_gpu, nvmlProcessInfo_r535_t *out);

/* The two-call protocol every version shares: ask for the count, then fill the array. */
static nvmlReturn_t list_processes(const char *fn, nvmlDevice_t device, unsigned int *count,
                                   void *records, size_t stride) {
    struct gpu *gpu;
    struct mig *mig;
    static nvmlProcessInfo_r535_t found[MAX_PROCS * 2];
    unsigned int wanted = 0;
    nvmlReturn_t ret = is_mig_handle(device) ? enter_mig(fn, device, count, &mig)
                                             : enter_device(fn, device, count, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (st.stride32 && strstr(fn, "_v3") != NULL) stride = sizeof(nvmlProcessInfo_r535_t);
    for (int i = 0; i < st.proc_count && !is_mig_handle(device); i++) {
        if (st.procs[i].gpu != device->index) continue;
        /* Every layout starts with pid then usedGpuMemory; v2+ add instance ids (none: ~0). */
        memset(&found[wanted], 0, sizeof found[wanted]);
        found[wanted].pid = st.procs[i].pid;
        found[wanted].usedGpuMemory = st.procs[i].used;
        found[wanted].gpuInstanceId = found[wanted].computeInstanceId = ~0u;
        wanted++;
    }
    wanted += (unsigned int)mig_records(device, !is_mig_handle(device), found + wanted);
    if (records == NULL || *count < wanted) {
        *count = wanted;
        return wanted == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < wanted; i++) memcpy((char *)records + stride * i, &found[i], stride);
    *count = wanted;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos) {
    return list_processes("nvmlDeviceGetComputeRunningProcesses", device, count, infos,
                          sizeof(nvmlProcessInfo_v1_t));
}

#ifndef NO_V2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return list_processes("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos,
                          sizeof(nvmlProcessInfo_v2_t));
}
#endif

#ifndef NO_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return list_processes("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos,
                          sizeof(nvmlProcessInfo_v2_t));
}
#endif

/* ---- MIG: modes, MIG device handles, and what a MIG handle answers ------------------------ */

/* The records of the processes on MIG devices: those of one MIG handle, or (whole_gpu) those
 * of every MIG device of a full GPU, as the aggregate listing real drivers give root. */
static int mig_records(nvmlDevice_t device, int whole_gpu, nvmlProcessInfo_r535_t *out) {
    int n = 0;
    for (int i = 0; i < st.mig_proc_count; i++) {
        const struct mig *m = &st.migs[st.mig_procs[i].gpu];
        if (whole_gpu ? m->gpu != (int)device->index : st.mig_procs[i].gpu != device->index)
            continue;
        memset(&out[n], 0, sizeof out[n]);
        out[n].pid = st.mig_procs[i].pid;
        out[n].usedGpuMemory = st.mig_procs[i].used;
        out[n].gpuInstanceId = m->gpu_instance;
        out[n].computeInstanceId = m->compute_instance;
        n++;
    }
    return n;
}

static nvmlReturn_t mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct mig *mig;
    nvmlReturn_t ret = enter_mig("nvmlDeviceGetUUID", device, uuid, &mig);
    return ret != NVML_SUCCESS ? ret : copy_string(mig->uuid, uuid, length);
}

/* Like real drivers: the parent's name, " MIG ", the profile (e.g. "... MIG 1g.10gb"). */
static nvmlReturn_t mig_name(nvmlDevice_t device, char *name, unsigned int length) {
    struct mig *mig;
    char full[192];
    nvmlReturn_t ret = enter_mig("nvmlDeviceGetName", device, name, &mig);
    if (ret != NVML_SUCCESS) return ret;
    snprintf(full, sizeof full, "%s MIG %s", st.gpus[mig->gpu].name, mig->profile);
    return copy_string(full, name, length);
}

static nvmlReturn_t mig_memory(const char *fn, nvmlDevice_t device, unsigned long long *total,
                               unsigned long long *free, unsigned long long *used) {
    struct mig *mig;
    nvmlReturn_t ret = enter_mig(fn, device, total, &mig);
    if (ret != NVML_SUCCESS) return ret;
    *total = mig->total;
    *used = mig->used;
    *free = mig->used > mig->total ? 0 : mig->total - mig->used;
    return NVML_SUCCESS;
}

#ifndef NO_MIG
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                  unsigned int *pending) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMigMode", device, current, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (st.mig_current[device->index] < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned int)st.mig_current[device->index];
    *pending = (unsigned int)st.mig_pending[device->index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMaxMigDeviceCount", device, count, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (st.mig_current[device->index] < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = MAX_MIGS_PER_GPU;
    return NVML_SUCCESS;
}

/* The index-th MIG device of the GPU; NOT_FOUND where none is (real drivers leave gaps). */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *mig) {
    struct gpu *gpu;
    unsigned int seen = 0;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMigDeviceHandleByIndex", device, mig, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (st.mig_current[device->index] != 1) return NVML_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < st.mig_count; i++) {
        if (st.migs[i].gpu != (int)device->index || seen++ != index) continue;
        mig_handles[i].index = (unsigned int)i;
        *mig = &mig_handles[i];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    if (device == NULL || is_mig == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = (unsigned int)is_mig_handle(device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device,
                                                          nvmlDevice_t *parent) {
    struct mig *mig;
    nvmlReturn_t ret = enter_mig("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", device, parent,
                                 &mig);
    if (ret != NVML_SUCCESS) return ret;
    handles[mig->gpu].index = (unsigned int)mig->gpu;
    *parent = &handles[mig->gpu];
    return NVML_SUCCESS;
}

/* On a full-GPU handle real drivers answer INVALID_ARGUMENT: ids belong to MIG devices. */
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    struct mig *mig;
    nvmlReturn_t ret = enter_mig("nvmlDeviceGetGpuInstanceId", device, id, &mig);
    if (ret != NVML_SUCCESS) return ret;
    *id = mig->gpu_instance;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    struct mig *mig;
    nvmlReturn_t ret = enter_mig("nvmlDeviceGetComputeInstanceId", device, id, &mig);
    if (ret != NVML_SUCCESS) return ret;
    *id = mig->compute_instance;
    return NVML_SUCCESS;
}
#endif

/* --- health calls ------------------------------------------------------------------------ */

#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetTotalEccErrors", device, count, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    /* Only volatile uncorrected errors are simulated; corrected and aggregate read 0. */
    *count = error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED && counter_type == NVML_VOLATILE_ECC
                 ? st.health[device->index].ecc_uncorrected
                 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetRetiredPagesPendingStatus", device, pending, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    *pending = st.health[device->index].retired_pending ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetRemappedRows", device, corr, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    if (unc == NULL || pending == NULL || failure == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *corr = st.health[device->index].remap[0];
    *unc = st.health[device->index].remap[1];
    *pending = st.health[device->index].remap[2];
    *failure = st.health[device->index].remap[3];
    return NVML_SUCCESS;
}

static nvmlReturn_t throttle_reasons(const char *fn, nvmlDevice_t device,
                                     unsigned long long *reasons) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device(fn, device, reasons, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    *reasons = st.health[device->index].throttle;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *reasons) {
    return throttle_reasons("nvmlDeviceGetCurrentClocksEventReasons", device, reasons);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *reasons) {
    return throttle_reasons("nvmlDeviceGetCurrentClocksThrottleReasons", device, reasons);
}

/* which: 0 current gen, 1 max gen, 2 current width, 3 max width. */
static nvmlReturn_t pcie_link(const char *fn, nvmlDevice_t device, unsigned int *value,
                              int which) {
    static const unsigned int defaults[4] = {5, 5, 16, 16};
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device(fn, device, value, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    *value = st.health[device->index].link_set ? st.health[device->index].link[which]
                                               : defaults[which];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return pcie_link("nvmlDeviceGetCurrPcieLinkGeneration", device, gen, 0);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return pcie_link("nvmlDeviceGetMaxPcieLinkGeneration", device, gen, 1);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return pcie_link("nvmlDeviceGetCurrPcieLinkWidth", device, width, 2);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return pcie_link("nvmlDeviceGetMaxPcieLinkWidth", device, width, 3);
}

#ifndef NO_EVENTS
#define NVML_EVENT_TYPE_XID 8ULL

typedef struct nvmlEventSet_st {
    unsigned long long registered[MAX_GPUS]; /* event types asked for, per GPU */
} *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static struct nvmlEventSet_st event_set;
/* How many "xid" lines of each GPU were delivered: the state file is re-read on every call. */
static int xids_delivered[MAX_GPUS];

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t ret = enter("nvmlEventSetCreate", -1);
    if (ret != NVML_SUCCESS) return ret;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(&event_set, 0, sizeof event_set);
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                      nvmlEventSet_t set) {
    struct gpu *gpu;
    nvmlReturn_t ret = enter_device("nvmlDeviceRegisterEvents", device, set, &gpu);
    if (ret != NVML_SUCCESS) return ret;
    set->registered[device->index] |= types;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) {
    nvmlReturn_t ret = enter("nvmlEventSetWait_v2", -1);
    (void)ms; /* nothing else can raise an event: answer at once instead of waiting */
    if (ret != NVML_SUCCESS) return ret;
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < st.xid_count; i++) {
        unsigned int g = st.xids[i].gpu;
        int seen = 0;
        if (!(set->registered[g] & NVML_EVENT_TYPE_XID)) continue;
        for (int j = 0; j < i; j++) seen += st.xids[j].gpu == g;
        if (seen < xids_delivered[g]) continue;
        xids_delivered[g]++;
        memset(data, 0, sizeof *data);
        handles[g].index = g;
        data->device = &handles[g];
        data->eventType = NVML_EVENT_TYPE_XID;
        data->eventData = st.xids[i].code;
        data->gpuInstanceId = data->computeInstanceId = ~0u;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(set, 0, sizeof *set);
    return NVML_SUCCESS;
}
#endif
