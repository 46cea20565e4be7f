/* The recorded GPU launch, repeated in C (included by _cscan.c, after the CPU replay's
 * key and exchange table).
 *
 * A repeated CUDA call of the same shapes, strides, dtypes, device and tuning is found
 * by the replay's key (built from the tensors' metadata through DLPack's exchange table:
 * no Python attribute read), its numbers are range-checked, its outputs and scratch
 * buffers are allocated by at::empty_strided / at::zeros where _torchalloc.cpp is built,
 * else by torch.empty_strided / torch.zeros from Python (either way torch's caching
 * allocator, so CUDA graph capture and streams behave as for any torch op), and each
 * recorded kernel is started by one cuLaunchKernel on torch's current stream of the
 * device, with its parameters written from a template: the compiled kernel Triton built
 * for the first call, the same grid, warps and shared memory, the addresses and numbers
 * of this call. What it does is what a _record.Recorded run by _launch.Replay does through Triton's
 * launcher; the record is built in Python (rl_triton_core/scan/_claunch.py) from a launch that
 * just ran through Triton's own launcher, so a replay starts nothing Triton did not.
 *
 * The driver is found at run time (dlopen of libcuda, as torch and Triton find it): no
 * CUDA header or toolkit at build time. Anything not recognised returns None and the
 * Python path takes the call.
 */

#if defined(_WIN32)
#define GPU_REPLAY 0
#else
#define GPU_REPLAY 1
#include <dlfcn.h>
#endif

#define DL_CUDA 2
#define GL_LAUNCHES 4 /* kernels of one recorded call, at most */
#define GL_PARAMS 96  /* parameters of one kernel, at most */
#define GL_ALLOCS 4   /* tensors a call allocates (outputs first), at most */

/* a parameter's source */
enum { P_CONST = 0, P_ALLOC, P_ARG, P_F32, P_HI, P_LO };

typedef struct {
    void *fn; /* CUfunction */
    uint32_t grid[3], block, shared;
    int32_t nparams;
    int8_t kind[GL_PARAMS]; /* P_* */
    int8_t idx[GL_PARAMS];  /* the allocation or the user's argument it comes from */
    uint8_t size[GL_PARAMS]; /* bytes the kernel reads: 4 or 8 */
    uint64_t value[GL_PARAMS]; /* a constant's bits (P_CONST) */
} glaunch_t;

typedef struct {
    int32_t nargs, nlaunch, nret, nalloc;
    int8_t num[KEY_ARGS]; /* 1: the argument is a number, checked against [lo, hi] */
    double lo[KEY_ARGS], hi[KEY_ARGS];
    int64_t extent[KEY_ARGS]; /* an out= call: each tensor's bytes from its address */
    int8_t ret_kind[GL_ALLOCS], ret_idx[GL_ALLOCS]; /* the results: allocations or
                                                         the caller's out= tensors */
    glaunch_t l[GL_LAUNCHES];
} grecord_t;

typedef int (*cu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, void *, void **, void **);
typedef int (*cu_ctx_dev_t)(int *);
typedef int (*cu_param_info_t)(void *, size_t, size_t *, size_t *);
typedef int (*dl_stream_t)(int32_t, int32_t, void **);

static cu_launch_t cu_launch;
static cu_ctx_dev_t cu_ctx_device;
static cu_param_info_t cu_param_info;
static dl_stream_t dl_stream;
static PyObject *torch_empty_strided, *torch_zeros, *triton_runtime, *kw_dtype_device;
static PyObject *s_enter_hook, *s_exit_hook, *s_calls;

/* at::empty_strided / at::zeros from torch's C++ API (_torchalloc.cpp, handed over by
 * gpu_alloc), or NULL: torch.empty_strided / torch.zeros called as Python functions */
typedef PyObject *(*ext_alloc_t)(int, const int64_t *, const int64_t *, int, int, int, int,
                                 void **);
static ext_alloc_t ext_alloc;
/* a call's scratch block (a workspace that is not returned) from torch's CUDA caching
 * allocator, without a tensor: _torchalloc.cpp's scratch_fns, or NULL: a tensor */
typedef struct {
    void *(*get)(size_t, int, void **);
    void (*put)(void *);
} ext_scratch_t;
static const ext_scratch_t *ext_scratch;

/* gpu_alloc(alloc, plain[, blob[, view[, scratch]]]): the C replay allocates through the
 * capsule alloc's function from now on (_torchalloc.py checks its dtype numbers first),
 * checks tensors through plain's where it is a capsule (else by their attributes), makes
 * its CPU outputs from the block cache through blob's, reads CPU tensors through view's
 * and takes CUDA scratch blocks through scratch's where those are capsules (else
 * DLPack and tensors); gpu_alloc(None, None): the Python functions, attributes and
 * DLPack again. True */
static PyObject *gpu_alloc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "_cscan.gpu_alloc(alloc, plain[, blob[, view[, scratch]]])");
        return NULL;
    }
    void *f = NULL, *p = NULL, *b = NULL, *v = NULL, *sc = NULL;
    if (args[0] != Py_None &&
        !(f = PyCapsule_GetPointer(args[0], "rl_triton_core._torchalloc.alloc2")))
        return NULL;
    if (args[1] != Py_None &&
        !(p = PyCapsule_GetPointer(args[1], "rl_triton_core._torchalloc.plain")))
        return NULL;
    if (nargs >= 3 && args[2] != Py_None &&
        !(b = PyCapsule_GetPointer(args[2], "rl_triton_core._torchalloc.blob")))
        return NULL;
    if (nargs >= 4 && args[3] != Py_None &&
        !(v = PyCapsule_GetPointer(args[3], "rl_triton_core._torchalloc.view")))
        return NULL;
    if (nargs >= 5 && args[4] != Py_None &&
        !(sc = PyCapsule_GetPointer(args[4], "rl_triton_core._torchalloc.scratch")))
        return NULL;
    ext_alloc = (ext_alloc_t)f;
    ext_plain = (ext_plain_t)p;
    ext_blob = (ext_blob_t)b;
    ext_view = (ext_view_t)v;
    ext_scratch = (const ext_scratch_t *)sc;
    ext_view_cuda = 0; /* until gpu_views(True) */
    Py_RETURN_TRUE;
}

/* gpu_views(on): whether the replay reads CUDA tensors through gpu_alloc's view too
 * (_torchalloc.py turns it on where view describes CUDA samples as DLPack does); the
 * previous setting */
static PyObject *gpu_views(PyObject *self, PyObject *arg) {
    const int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    const int was = ext_view_cuda;
    ext_view_cuda = on && ext_view;
    return PyBool_FromLong(was);
}

/* A call's tensor from its record's spec (size, stride, dtype, zeroed, scalar type: the
 * c10 number, or -1) on device (device_type, index; device: the torch.device): through
 * ext_alloc where it is set and the spec has a number (*data: its address), else the
 * Python functions (*data: NULL). A new reference, or NULL with an error set. */
static PyObject *alloc_spec(PyObject *spec, PyObject *device, int device_type, int index,
                            void **data) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 5) {
        PyErr_SetString(PyExc_ValueError, "_cscan: an allocation spec of 5 or 6 items");
        return NULL;
    }
    PyObject *size = PyTuple_GET_ITEM(spec, 0), *stride = PyTuple_GET_ITEM(spec, 1);
    const int zeroed = PyTuple_GET_ITEM(spec, 3) == Py_True;
    const long code = PyLong_AsLong(PyTuple_GET_ITEM(spec, 4));
    if (code == -1 && PyErr_Occurred()) return NULL;
    if (ext_alloc && code >= 0 && PyTuple_Check(size) && PyTuple_Check(stride) &&
        PyTuple_GET_SIZE(size) == PyTuple_GET_SIZE(stride) && PyTuple_GET_SIZE(size) <= 8) {
        int64_t sz[8], st[8];
        const int nd = (int)PyTuple_GET_SIZE(size);
        for (int d = 0; d < nd; d++) {
            sz[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(size, d));
            st[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, d));
        }
        if (PyErr_Occurred()) return NULL;
        return ext_alloc(nd, sz, st, (int)code, device_type, index, zeroed, data);
    }
    *data = NULL; /* (not known: the caller reads it) */
    if (zeroed) {
        PyObject *call[3] = {size, PyTuple_GET_ITEM(spec, 2), device};
        return PyObject_Vectorcall(torch_zeros, call, 1, kw_dtype_device);
    }
    PyObject *call[4] = {size, stride, PyTuple_GET_ITEM(spec, 2), device};
    return PyObject_Vectorcall(torch_empty_strided, call, 2, kw_dtype_device);
}

/* alloc_test(spec, device): alloc_spec on a CPU device (tests: the capsule's tensors) */
static PyObject *alloc_test(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !torch_empty_strided) {
        PyErr_SetString(PyExc_TypeError, "_cscan.alloc_test(spec, device) after gpu_bind");
        return NULL;
    }
    void *data;
    PyObject *t = alloc_spec(args[0], args[1], 0 /* c10::DeviceType::CPU */, -1, &data);
    if (t && data && Py_IS_TYPE(t, tensor_type)) { /* the address it says is the tensor's */
        dl_tensor_t d;
        if (dl_api->dltensor_from_py_object_no_sync(t, &d)) {
            Py_DECREF(t);
            return NULL;
        }
        if (d.data != data) {
            Py_DECREF(t);
            PyErr_SetString(PyExc_AssertionError, "_cscan.alloc_test: another address");
            return NULL;
        }
    }
    return t;
}

/* gpu_hooks(triton.knobs.runtime): where the replay reads Triton's launch hooks; called
 * (by _claunch.key) before the first CUDA call is keyed for a record, from when on CUDA
 * calls build keys; True */
static PyObject *gpu_hooks(PyObject *self, PyObject *arg) {
    Py_INCREF(arg);
    Py_XSETREF(triton_runtime, arg);
    gpu_kept = 1;
    Py_RETURN_TRUE;
}

/* gpu_bind(torch.empty_strided, torch.zeros): keeps the allocation functions and finds
 * the CUDA driver's entry points; True where the GPU replay can run. */
static PyObject *gpu_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_cscan.gpu_bind(empty_strided, zeros)");
        return NULL;
    }
    if (!kw_dtype_device && !(kw_dtype_device = Py_BuildValue("(ss)", "dtype", "device")))
        return NULL;
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(torch_empty_strided, args[0]);
    Py_XSETREF(torch_zeros, args[1]);
#if GPU_REPLAY
    if (!dl_api) Py_RETURN_FALSE;
    /* DLPack's current_work_stream follows dltensor_from_py_object_no_sync */
    dl_stream = (dl_stream_t)(((void *const *)&dl_api->dltensor_from_py_object_no_sync)[1]);
    if (!dl_stream) Py_RETURN_FALSE;
    if (!cu_launch) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) Py_RETURN_FALSE;
        cu_launch = (cu_launch_t)dlsym(lib, "cuLaunchKernel");
        cu_ctx_device = (cu_ctx_dev_t)dlsym(lib, "cuCtxGetDevice");
        cu_param_info = (cu_param_info_t)dlsym(lib, "cuFuncGetParamInfo");
        if (!cu_launch || !cu_ctx_device || !cu_param_info) {
            cu_launch = NULL;
            Py_RETURN_FALSE;
        }
    }
    if (!s_enter_hook && !(s_enter_hook = PyUnicode_InternFromString("launch_enter_hook")))
        return NULL;
    if (!s_exit_hook && !(s_exit_hook = PyUnicode_InternFromString("launch_exit_hook")))
        return NULL;
    if (!s_calls && !(s_calls = PyUnicode_InternFromString("calls"))) return NULL;
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

/* param_sizes(function): the byte size of each parameter of a CUfunction (an int), as
 * the driver reports them; None where it cannot. */
static PyObject *param_sizes(PyObject *self, PyObject *arg) {
    if (!cu_param_info) Py_RETURN_NONE;
    void *fn = PyLong_AsVoidPtr(arg);
    if (!fn) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *res = PyList_New(0);
    if (!res) return NULL;
    for (size_t i = 0; i < 4 * GL_PARAMS; i++) {
        size_t off = 0, size = 0;
        if (cu_param_info(fn, i, &off, &size)) break; /* past the last parameter */
        PyObject *s = PyLong_FromSize_t(size);
        if (!s || PyList_Append(res, s)) {
            Py_XDECREF(s);
            Py_DECREF(res);
            return NULL;
        }
        Py_DECREF(s);
    }
    return res;
}

/* grecord(nargs, nalloc, checks, launches, returns, extents): a grecord_t as bytes, of a
 * call that allocates nalloc tensors (outputs, workspaces). checks: per
 * argument of the call, None or (lo, hi) for a number; launches: per kernel (function,
 * (gx, gy, gz), threads, shared bytes, params), params a tuple of (kind, index, size,
 * bits); returns: the results, each (P_ALLOC, allocation) or (P_ARG, argument: an out=
 * tensor); extents: per argument its bytes from its address (0: not a tensor, or
 * empty), which an out= tensor must not share with another. None where it does not
 * fit. */
static PyObject *grecord(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3]) ||
        !PyTuple_Check(args[4]) || !PyTuple_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "_cscan.grecord(nargs, nalloc, checks, launches, returns, extents)");
        return NULL;
    }
    grecord_t r;
    memset(&r, 0, sizeof(r));
    const long n = PyLong_AsLong(args[0]), na = PyLong_AsLong(args[1]);
    if ((n == -1 || na == -1) && PyErr_Occurred()) return NULL;
    args++; /* checks, launches, returns, extents at 1..4 */
    const Py_ssize_t nl = PyTuple_GET_SIZE(args[2]);
    const Py_ssize_t nr = PyTuple_GET_SIZE(args[3]);
    if (n < 0 || n > KEY_ARGS || na < 0 || na > GL_ALLOCS || PyTuple_GET_SIZE(args[1]) != n ||
        nl < 1 || nl > GL_LAUNCHES || nr < 1 || nr > GL_ALLOCS || PyTuple_GET_SIZE(args[4]) != n)
        Py_RETURN_NONE;
    r.nargs = (int32_t)n;
    r.nalloc = (int32_t)na;
    r.nlaunch = (int32_t)nl;
    r.nret = (int32_t)nr;
    for (Py_ssize_t i = 0; i < nr; i++) {
        int kind, idx;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(args[3], i), "ii", &kind, &idx)) return NULL;
        if (!((kind == P_ALLOC && idx >= 0 && idx < na) ||
              (kind == P_ARG && idx >= 0 && idx < n))) {
            PyErr_SetString(PyExc_ValueError, "_cscan.grecord: a result out of range");
            return NULL;
        }
        r.ret_kind[i] = (int8_t)kind;
        r.ret_idx[i] = (int8_t)idx;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        r.extent[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[4], i));
        if (r.extent[i] == -1 && PyErr_Occurred()) return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyTuple_GET_ITEM(args[1], i);
        if (c == Py_None) continue;
        if (!PyArg_ParseTuple(c, "dd", &r.lo[i], &r.hi[i])) return NULL;
        r.num[i] = 1;
    }
    for (Py_ssize_t j = 0; j < nl; j++) {
        glaunch_t *L = &r.l[j];
        PyObject *fn, *params;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(args[2], j), "O(III)IIO!", &fn, &L->grid[0],
                              &L->grid[1], &L->grid[2], &L->block, &L->shared, &PyTuple_Type,
                              &params))
            return NULL;
        if (!(L->fn = PyLong_AsVoidPtr(fn))) {
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
        const Py_ssize_t np = PyTuple_GET_SIZE(params);
        if (np > GL_PARAMS) Py_RETURN_NONE;
        L->nparams = (int32_t)np;
        for (Py_ssize_t i = 0; i < np; i++) {
            int kind, idx, size;
            unsigned long long bits;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(params, i), "iiiK", &kind, &idx, &size,
                                  &bits))
                return NULL;
            if (kind < P_CONST || kind > P_LO || (size != 4 && size != 8) ||
                (kind == P_ALLOC && (idx < 0 || idx >= na)) ||
                (kind >= P_ARG && (idx < 0 || idx >= n)) ||
                (kind >= P_F32 && !r.num[idx])) {
                PyErr_SetString(PyExc_ValueError, "_cscan.grecord: a parameter out of range");
                return NULL;
            }
            L->kind[i] = (int8_t)kind;
            L->idx[i] = (int8_t)idx;
            L->size[i] = (uint8_t)size;
            L->value[i] = bits;
        }
    }
    return PyBytes_FromStringAndSize((const char *)&r, sizeof(r));
}

#define F32_MAX_SPLIT 3.4e38 /* as _host.split: the rounded hi stays finite */

/* the float32 pair (hi, lo) with hi + lo == x to ~48 bits (_host.split) */
static void split_f32(double x, float *hi, float *lo) {
    if (!(fabs(x) < F32_MAX_SPLIT)) {
        *hi = x != x ? (float)x : (float)copysign(INFINITY, x);
        *lo = 0.0f;
        return;
    }
    *hi = (float)x;
    *lo = (float)(x - (double)*hi);
}


/* The replay of a GPU recording rec = (grecord bytes, allocations, tuning, results, device)
 * for the user's arguments call_args (whose views are in dl; plain: 1 where the key read
 * every tensor as plain, else -1: checked here); None (the Python path) where
 * a check fails. allocations: per tensor (size, stride, dtype, zeroed, c10 scalar type or
 * -1, the bytes of a workspace taken as a block: 0 for a result, a zeroed one or any
 * other taken as a tensor). */
static PyObject *gpu_replay(PyObject *rec, PyObject *call_args, const dl_tensor_t *dl,
                            int plain) {
#if GPU_REPLAY
    if (!cu_launch || !triton_runtime) Py_RETURN_NONE;
    PyObject *blob = PyTuple_GET_ITEM(rec, 0), *allocs = PyTuple_GET_ITEM(rec, 1);
    PyObject *device = PyTuple_GET_ITEM(rec, 4);
    if (!PyBytes_Check(blob) || PyBytes_GET_SIZE(blob) != (Py_ssize_t)sizeof(grecord_t) ||
        !PyTuple_Check(allocs))
        Py_RETURN_NONE;
    const grecord_t *r = (const grecord_t *)PyBytes_AS_STRING(blob);
    /* (grecord checked every index against nargs and nalloc) */
    if (PyTuple_GET_SIZE(call_args) != r->nargs || PyTuple_GET_SIZE(allocs) != r->nalloc)
        Py_RETURN_NONE;
    /* a launch hook (a profiler) is called by Triton's launcher: the Python path. The
     * hooks are None or a chain of them (triton.knobs.HookChain: set where its calls
     * list is not empty) */
    for (int h = 0; h < 2; h++) {
        PyObject *hook = PyObject_GetAttr(triton_runtime, h ? s_exit_hook : s_enter_hook);
        if (!hook) return NULL;
        if (hook == Py_None) {
            Py_DECREF(hook);
            continue;
        }
        PyObject *calls = PyObject_GetAttr(hook, s_calls);
        Py_DECREF(hook);
        if (!calls) {
            PyErr_Clear();
            Py_RETURN_NONE; /* a hook of another kind */
        }
        const int set = !PyList_CheckExact(calls) || PyList_GET_SIZE(calls) != 0;
        Py_DECREF(calls);
        if (set) Py_RETURN_NONE;
    }
    double nums[KEY_ARGS];
    int dev = -1;
    for (Py_ssize_t i = 0; i < r->nargs; i++) {
        PyObject *a = PyTuple_GET_ITEM(call_args, i);
        if (Py_IS_TYPE(a, tensor_type)) {
            if (plain != 1) { /* (1: the key read every tensor as plain) */
                const int p = plain_tensor(a);
                if (p < 0) return NULL;
                if (!p) Py_RETURN_NONE;
            }
            if (dl[i].device.device_type == DL_CUDA) dev = dl[i].device.device_id;
        } else if (r->num[i]) {
            const double x = PyFloat_AsDouble(a);
            if (x == -1.0 && PyErr_Occurred()) return NULL;
            if (!(r->lo[i] <= x && x <= r->hi[i])) Py_RETURN_NONE; /* NaN too: the error */
            nums[i] = x;
        }
    }
    /* out= tensors: none may share memory with another tensor of the call (the Python
     * path raises the error), from the addresses and the extents the key fixes */
    for (int k = 0; k < r->nret; k++) {
        if (r->ret_kind[k] != P_ARG) continue;
        const int o = r->ret_idx[k];
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(call_args, o), tensor_type) || !r->extent[o]) continue;
        const uintptr_t lo = (uintptr_t)dl[o].data, hi = lo + (uintptr_t)r->extent[o];
        for (int i = 0; i < r->nargs; i++) {
            if (i == o || !r->extent[i] || !Py_IS_TYPE(PyTuple_GET_ITEM(call_args, i), tensor_type))
                continue;
            const uintptr_t p = (uintptr_t)dl[i].data, q = p + (uintptr_t)r->extent[i];
            if (p < hi && lo < q) Py_RETURN_NONE;
        }
    }
    /* Triton launches on the current device: another one takes the Python path, which
     * makes the tensors' device current */
    int cur = -1;
    if (dev < 0 || cu_ctx_device(&cur) || cur != dev) Py_RETURN_NONE;
    void *stream = NULL;
    if (dl_stream(DL_CUDA, dev, &stream)) return NULL;
    PyObject *out[GL_ALLOCS] = {NULL};
    void *ptr[GL_ALLOCS] = {NULL}, *held[GL_ALLOCS] = {NULL};
    const ext_scratch_t *const scratch = ext_scratch; /* (gpu_alloc may change it meanwhile) */
    const Py_ssize_t na = PyTuple_GET_SIZE(allocs);
    PyObject *res = NULL;
    for (Py_ssize_t j = 0; j < na; j++) {
        PyObject *spec = PyTuple_GET_ITEM(allocs, j);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 6) goto done;
        /* a workspace (its bytes: the record's, 0 for a result or a zeroed one): a block,
         * no tensor */
        const long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 5));
        if (nbytes == -1 && PyErr_Occurred()) goto done;
        if (scratch && nbytes > 0) {
            if ((held[j] = scratch->get((size_t)nbytes, dev, &ptr[j])))
                continue;
            if (PyErr_Occurred()) goto done;
        }
        PyObject *t = alloc_spec(spec, device, 1 /* CUDA */, dev, &ptr[j]);
        if (!t) goto done;
        out[j] = t;
        if (!Py_IS_TYPE(t, tensor_type)) goto done;
        if (!ptr[j]) { /* (from Python) */
            dl_tensor_t d;
            if (dl_api->dltensor_from_py_object_no_sync(t, &d)) goto done;
            ptr[j] = d.data;
        }
    }
    for (int j = 0; j < r->nlaunch; j++) {
        const glaunch_t *L = &r->l[j];
        uint64_t slot[GL_PARAMS];
        void *params[GL_PARAMS];
        for (int i = 0; i < L->nparams; i++) {
            uint64_t v = L->value[i];
            float hi, lo;
            switch (L->kind[i]) {
            case P_ALLOC: v = (uint64_t)(uintptr_t)ptr[L->idx[i]]; break;
            case P_ARG: v = (uint64_t)(uintptr_t)dl[L->idx[i]].data; break;
            case P_F32: hi = (float)nums[L->idx[i]]; v = 0; memcpy(&v, &hi, 4); break;
            case P_HI:
            case P_LO:
                split_f32(nums[L->idx[i]], &hi, &lo);
                v = 0;
                memcpy(&v, L->kind[i] == P_HI ? &hi : &lo, 4);
                break;
            default: break;
            }
            slot[i] = v; /* little-endian: a 4-byte parameter is the slot's first bytes */
            params[i] = &slot[i];
        }
        const int err = cu_launch(L->fn, L->grid[0], L->grid[1], L->grid[2], L->block, 1, 1,
                                  L->shared, stream, params, NULL);
        if (err) {
            PyErr_Format(PyExc_RuntimeError,
                         "rl_triton_core: cuLaunchKernel failed (CUDA error %d)", err);
            goto done;
        }
    }
    {
        PyObject *got[GL_ALLOCS];
        for (int k = 0; k < r->nret; k++)
            got[k] = r->ret_kind[k] == P_ALLOC ? out[r->ret_idx[k]]
                                                : PyTuple_GET_ITEM(call_args, r->ret_idx[k]);
        if (r->nret == 1) {
            res = got[0];
            Py_XINCREF(res);
        } else if ((res = PyTuple_New(r->nret))) {
            for (int k = 0; k < r->nret; k++) {
                Py_XINCREF(got[k]);
                PyTuple_SET_ITEM(res, k, got[k]);
            }
        }
    }
done:
    for (Py_ssize_t j = 0; j < GL_ALLOCS; j++) {
        if (held[j]) scratch->put(held[j]); /* (after the launches: stream-ordered) */
        Py_XDECREF(out[j]);
    }
    if (!res && !PyErr_Occurred()) Py_RETURN_NONE;
    return res;
#else
    (void)rec, (void)call_args, (void)dl, (void)plain;
    Py_RETURN_NONE;
#endif
}
