/* hpcrl._kernels: the hot numeric loops, in C.
 *
 * gae()            generalised advantage estimation (same recursion as hpcrl/algos/gae.py)
 * vtrace()         V-trace targets and policy-gradient advantages (hpcrl/algos/vtrace.py)
 * sumtree_update() set leaves of a sum-tree and recompute their paths (hpcrl/algos/sumtree.py)
 * sumtree_sample() prefix-sum descent from the root to a leaf per value (hpcrl/algos/sumtree.py)
 *
 * Arrays arrive as C-contiguous buffers (hpcrl/algos/kernels.py checks dtypes and shapes and
 * allocates the outputs); the loops run with the GIL released. For GAE and V-trace time runs
 * backwards over t, and the inner loop over the N envs is contiguous, so the compiler can
 * vectorise it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static int check_len(Py_buffer *b, Py_ssize_t want, const char *name) {
    if (b->len != want) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", name, want, b->len);
        return 0;
    }
    return 1;
}

static PyObject *py_gae(PyObject *self, PyObject *args) {
    Py_buffer r, v, nv, d, adv;
    Py_ssize_t T, N;
    double gamma, lam;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nndd", &r, &v, &nv, &d, &adv, &T, &N, &gamma, &lam))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n4 = T * N * 4;
    if (check_len(&r, n4, "rewards") && check_len(&v, n4, "values") && check_len(&nv, n4, "next_values")
        && check_len(&d, T * N, "dones") && check_len(&adv, n4, "advantages")) {
        float *carry = calloc((size_t)(N > 0 ? N : 1), sizeof(float));
        if (!carry) {
            PyErr_NoMemory();
        } else {
            const float *rw = r.buf, *vv = v.buf, *nx = nv.buf;
            const uint8_t *dn = d.buf;
            float *out = adv.buf;
            const float g = (float)gamma, gl = (float)(gamma * lam);
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t t = T - 1; t >= 0; t--) {
                const Py_ssize_t row = t * N;
                for (Py_ssize_t n = 0; n < N; n++) {
                    const float delta = rw[row + n] + g * nx[row + n] - vv[row + n];
                    const float keep = dn[row + n] ? 0.0f : 1.0f;
                    carry[n] = delta + gl * keep * carry[n];
                    out[row + n] = carry[n];
                }
            }
            Py_END_ALLOW_THREADS
            free(carry);
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&r); PyBuffer_Release(&v); PyBuffer_Release(&nv); PyBuffer_Release(&d);
    PyBuffer_Release(&adv);
    return result;
}

static PyObject *py_vtrace(PyObject *self, PyObject *args) {
    Py_buffer lr, r, v, nv, d, vs, pg;
    Py_ssize_t T, N;
    double gamma, rho_bar, c_bar, lam;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*w*nndddd", &lr, &r, &v, &nv, &d, &vs, &pg, &T, &N,
                          &gamma, &rho_bar, &c_bar, &lam))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n4 = T * N * 4;
    if (check_len(&lr, n4, "log_rhos") && check_len(&r, n4, "rewards") && check_len(&v, n4, "values")
        && check_len(&nv, n4, "next_values") && check_len(&d, T * N, "dones") && check_len(&vs, n4, "vs")
        && check_len(&pg, n4, "pg_advantages")) {
        double *carry = calloc((size_t)(N > 0 ? N : 1), sizeof(double));
        if (!carry) {
            PyErr_NoMemory();
        } else {
            const float *lrho = lr.buf, *rw = r.buf, *vv = v.buf, *nx = nv.buf;
            const uint8_t *dn = d.buf;
            float *out_vs = vs.buf, *out_pg = pg.buf;
            Py_BEGIN_ALLOW_THREADS
            /* backwards: vs_t - V_t = delta_t + gamma c_t (1 - done_t) (vs_{t+1} - V_{t+1}) */
            for (Py_ssize_t t = T - 1; t >= 0; t--) {
                const Py_ssize_t row = t * N;
                for (Py_ssize_t n = 0; n < N; n++) {
                    const Py_ssize_t i = row + n;
                    const double ratio = exp((double)lrho[i]);
                    const double rho = ratio < rho_bar ? ratio : rho_bar;
                    const double c = lam * (ratio < c_bar ? ratio : c_bar);
                    const double keep = dn[i] ? 0.0 : 1.0;
                    const double delta = rho * (rw[i] + gamma * nx[i] - vv[i]);
                    carry[n] = delta + gamma * c * keep * carry[n];
                    out_vs[i] = (float)(vv[i] + carry[n]);
                }
            }
            /* forwards: pg advantage uses vs_{t+1} inside an episode, next_values at its end */
            for (Py_ssize_t t = 0; t < T; t++) {
                const Py_ssize_t row = t * N;
                for (Py_ssize_t n = 0; n < N; n++) {
                    const Py_ssize_t i = row + n;
                    const double ratio = exp((double)lrho[i]);
                    const double rho = ratio < rho_bar ? ratio : rho_bar;
                    const double next = (dn[i] || t == T - 1) ? (double)nx[i] : (double)out_vs[i + N];
                    out_pg[i] = (float)(rho * (rw[i] + gamma * next - vv[i]));
                }
            }
            Py_END_ALLOW_THREADS
            free(carry);
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&lr); PyBuffer_Release(&r); PyBuffer_Release(&v); PyBuffer_Release(&nv);
    PyBuffer_Release(&d); PyBuffer_Release(&vs); PyBuffer_Release(&pg);
    return result;
}

/* ---- sum-tree: double tree[2L], L a power of two; tree[1] the root, node n has children 2n
 * and 2n + 1, leaf i is tree[L + i]. The numpy reference (hpcrl/algos/sumtree.py) is the
 * specification; the checks below raise the same ValueErrors with the same messages. */

/* Both loops go one tree level at a time over a chunk of leaves or values, as the reference does
 * over the whole batch: the loads of one level are independent of each other, so their cache
 * misses overlap, where one path after another would wait for each miss in turn (a 1M-leaf tree
 * is 16 MB, mostly out of cache). SUMTREE_CHUNK bounds the stack arrays that hold the positions. */
#define SUMTREE_CHUNK 64

/* Set the leaves in order (a repeated index ends with its last priority), then recompute their
 * parents level by level from the children. A parent reached twice gets the same sum twice, and
 * a node's last recomputation comes after every change below it (in this chunk or an earlier
 * one), so the tree is the one the reference computes: a function of its leaves alone. */
static void sumtree_update_chunk(double *t, Py_ssize_t L, const int64_t *ix, const double *p, Py_ssize_t k) {
    Py_ssize_t node[SUMTREE_CHUNK];
    for (Py_ssize_t j = 0; j < k; j++) {
        node[j] = L + (Py_ssize_t)ix[j];
        t[node[j]] = p[j];
    }
    for (Py_ssize_t level = L; level > 1; level >>= 1) {
        for (Py_ssize_t j = 0; j < k; j++) {
            const Py_ssize_t n = node[j] >> 1;
            t[n] = t[2 * n] + t[2 * n + 1];
            node[j] = n;
        }
    }
}

/* From the root, go left if x < left sum, else subtract it and go right; but go right only when
 * the right sum is > 0, so round-off at the total never ends in a zero-priority leaf. */
static void sumtree_sample_chunk(const double *t, Py_ssize_t L, const double *v, int64_t *leaf, Py_ssize_t B) {
    Py_ssize_t node[SUMTREE_CHUNK];
    double x[SUMTREE_CHUNK];
    for (Py_ssize_t b = 0; b < B; b++) {
        node[b] = 1;
        x[b] = v[b];
    }
    for (Py_ssize_t level = 1; level < L; level <<= 1) {
        for (Py_ssize_t b = 0; b < B; b++) {  /* branch-free: the direction is a coin toss */
            const Py_ssize_t n = node[b];
            const double left = t[2 * n];
            const int right = (x[b] >= left) & (t[2 * n + 1] > 0);
            x[b] -= right ? left : 0.0;
            node[b] = 2 * n + right;
        }
    }
    for (Py_ssize_t b = 0; b < B; b++)
        leaf[b] = (int64_t)(node[b] - L);
}

static int check_tree(Py_buffer *tree, Py_ssize_t L) {
    if (L < 1 || (L & (L - 1))) {
        PyErr_Format(PyExc_ValueError, "a sum-tree has length 2L with L a power of two, got L = %zd", L);
        return 0;
    }
    return check_len(tree, 2 * L * (Py_ssize_t)sizeof(double), "tree");
}

/* k for a buffer of k items of `size` bytes, or -1 with a ValueError */
static Py_ssize_t item_count(Py_buffer *b, Py_ssize_t size, const char *name) {
    if (b->len % size) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     name, b->len, size);
        return -1;
    }
    return b->len / size;
}

/* ValueError "<name>[j] = <x as Python's repr(float)> is not <what> (valid: finite and >= 0)" */
static void bad_double(const char *name, Py_ssize_t j, double x, const char *what) {
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] = %s is not %s (valid: finite and >= 0)", name, j, text, what);
        PyMem_Free(text);
    }
}

static PyObject *py_sumtree_update(PyObject *self, PyObject *args) {
    Py_buffer tree, idx, pri;
    Py_ssize_t L;
    if (!PyArg_ParseTuple(args, "w*y*y*n", &tree, &idx, &pri, &L))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t k = item_count(&idx, sizeof(int64_t), "indices");
    if (k >= 0 && check_tree(&tree, L) && check_len(&pri, k * (Py_ssize_t)sizeof(double), "priorities")) {
        double *t = tree.buf;
        const int64_t *ix = idx.buf;
        const double *p = pri.buf;
        /* all checks before the first write: a rejected call leaves the tree as it was */
        Py_ssize_t bad_index = -1, bad_priority = -1;
        for (Py_ssize_t j = 0; j < k && bad_index < 0; j++)
            if (ix[j] < 0 || ix[j] >= L) bad_index = j;
        for (Py_ssize_t j = 0; j < k && bad_priority < 0 && bad_index < 0; j++)
            if (!(isfinite(p[j]) && p[j] >= 0)) bad_priority = j;
        if (bad_index >= 0) {
            PyErr_Format(PyExc_ValueError, "indices[%zd] = %lld is outside the tree's %zd leaves (valid: 0 to %zd)",
                         bad_index, (long long)ix[bad_index], L, L - 1);
        } else if (bad_priority >= 0) {
            bad_double("priorities", bad_priority, p[bad_priority], "a priority");
        } else {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < k; j += SUMTREE_CHUNK)
                sumtree_update_chunk(t, L, ix + j, p + j, k - j < SUMTREE_CHUNK ? k - j : SUMTREE_CHUNK);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&tree); PyBuffer_Release(&idx); PyBuffer_Release(&pri);
    return result;
}

static PyObject *py_sumtree_sample(PyObject *self, PyObject *args) {
    Py_buffer tree, val, out;
    Py_ssize_t L;
    if (!PyArg_ParseTuple(args, "y*y*w*n", &tree, &val, &out, &L))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t B = item_count(&val, sizeof(double), "values");
    if (B >= 0 && check_tree(&tree, L) && check_len(&out, B * (Py_ssize_t)sizeof(int64_t), "out_indices")) {
        const double *t = tree.buf, *v = val.buf;
        int64_t *leaf = out.buf;
        const double total = t[1];
        Py_ssize_t bad_value = -1;
        for (Py_ssize_t b = 0; b < B && bad_value < 0; b++)
            if (!(isfinite(v[b]) && v[b] >= 0)) bad_value = b;
        if (!(isfinite(total) && total > 0)) {
            char *text = PyOS_double_to_string(total, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (text) {
                PyErr_Format(PyExc_ValueError, "the tree's total priority is %s: nothing to sample "
                             "(sampling needs a positive, finite total)", text);
                PyMem_Free(text);
            }
        } else if (bad_value >= 0) {
            bad_double("values", bad_value, v[bad_value], "a prefix sum");
        } else {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t b = 0; b < B; b += SUMTREE_CHUNK)
                sumtree_sample_chunk(t, L, v + b, leaf + b, B - b < SUMTREE_CHUNK ? B - b : SUMTREE_CHUNK);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&tree); PyBuffer_Release(&val); PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"gae", py_gae, METH_VARARGS,
     "gae(rewards, values, next_values, dones, out_advantages, T, N, gamma, lam)"},
    {"vtrace", py_vtrace, METH_VARARGS,
     "vtrace(log_rhos, rewards, values, next_values, dones, out_vs, out_pg, T, N, gamma, rho_bar, c_bar, lam)"},
    {"sumtree_update", py_sumtree_update, METH_VARARGS,
     "sumtree_update(tree, indices, priorities, L): float64 tree[2L] in place, int64 indices[k], float64 priorities[k]"},
    {"sumtree_sample", py_sumtree_sample, METH_VARARGS,
     "sumtree_sample(tree, values, out_indices, L): float64 tree[2L], float64 values[B], int64 out_indices[B]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "C kernels for GAE, V-trace and the sum-tree (see hpcrl/algos/kernels.py)", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
