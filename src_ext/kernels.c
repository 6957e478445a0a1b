/* hpcrl._kernels: the hot numeric loops, in C.
 *
 * gae()            generalised advantage estimation (same recursion as hpcrl/algos/gae.py)
 * vtrace()         V-trace targets and policy-gradient advantages (hpcrl/algos/vtrace.py)
 * sumtree_update() set leaves of a sum-tree and recompute their paths (hpcrl/algos/sumtree.py)
 * sumtree_sample() prefix-sum descent from the root to a leaf per value (hpcrl/algos/sumtree.py)
 * replay_add_priorities(), replay_update_priorities(), replay_sample()
 *                  one prioritized-replay shard's priority writes and draws (hpcrl/algos/replay.py)
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

/* ---- one prioritized-replay shard (hpcrl/algos/replay.py): the work around the sum-tree that
 * add(), update_priorities() and sample() do, in one call each, so a call pays the Python and
 * numpy overhead once instead of for every small array operation. replay.py's numpy path is the
 * specification; these give the same trees bit for bit, the same raw priorities, max priority
 * and indices, and raise the same ValueErrors with the same messages. */

/* x ** a as numpy computes it for a float64 array and a scalar exponent: numpy turns the
 * exponents 0.5, 2 and -1 into sqrt, square and reciprocal (not always equal to pow in the last
 * bit), everything else goes to the C library's pow, as here. Bit-equal leaves need the same. */
static double numpy_power(double x, double a) {
    if (a == 0.5) return sqrt(x);
    if (a == 2.0) return x * x;
    if (a == -1.0) return 1.0 / x;
    return pow(x, a);
}

/* Write raw[j] to raw_store[row[j]] and leaf (raw[j] + eps) ** alpha to the tree, in order (a
 * repeated row ends with its last value, as sumtree.last_occurrences picks it), a chunk at a
 * time so the leaf values live on the stack. */
static void set_priorities(double *t, Py_ssize_t L, double *raw_store, const int64_t *row, const double *raw,
                           Py_ssize_t k, double alpha, double eps) {
    double leaf[SUMTREE_CHUNK];
    for (Py_ssize_t j = 0; j < k; j += SUMTREE_CHUNK) {
        const Py_ssize_t n = k - j < SUMTREE_CHUNK ? k - j : SUMTREE_CHUNK;
        for (Py_ssize_t i = 0; i < n; i++) {
            raw_store[row[j + i]] = raw[j + i];
            leaf[i] = numpy_power(raw[j + i] + eps, alpha);
        }
        sumtree_update_chunk(t, L, row + j, leaf, n);
    }
}

/* ValueError "<name>[j] = <x as Python's repr(float)> is not valid (valid: <valid>)", as
 * replay.py's _first_bad words it */
static void not_valid(const char *name, Py_ssize_t j, double x, const char *valid) {
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] = %s is not valid (valid: %s)", name, j, text, valid);
        PyMem_Free(text);
    }
}

static int check_replay(Py_buffer *tree, Py_ssize_t L, Py_buffer *raw_store, Py_ssize_t capacity) {
    if (capacity < 1 || capacity > L) {
        PyErr_Format(PyExc_ValueError, "a replay of capacity %zd does not fit a sum-tree of %zd leaves", capacity, L);
        return 0;
    }
    return check_tree(tree, L) && check_len(raw_store, capacity * (Py_ssize_t)sizeof(double), "raw_priorities");
}

/* add(): k new raw priorities for the ring rows first, first + 1, ... (mod capacity); only the
 * last min(k, capacity) are written (the newest rows), but all k are checked and count for the
 * max, as in replay.py. Returns max(max_priority, the largest of the k). */
static PyObject *py_replay_add_priorities(PyObject *self, PyObject *args) {
    Py_buffer tree, store, pri;
    Py_ssize_t L, capacity, first;
    double alpha, eps, max_priority;
    if (!PyArg_ParseTuple(args, "w*w*y*nnnddd", &tree, &store, &pri, &L, &capacity, &first, &alpha, &eps,
                          &max_priority))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t k = item_count(&pri, sizeof(double), "priorities");
    if (k >= 0 && check_replay(&tree, L, &store, capacity)) {
        const double *p = pri.buf;
        Py_ssize_t bad = -1;
        for (Py_ssize_t j = 0; j < k && bad < 0; j++) {
            if (!(isfinite(p[j]) && p[j] >= 0)) bad = j;
            else if (p[j] > max_priority) max_priority = p[j];
        }
        if (bad >= 0) {
            not_valid("priorities", bad, p[bad], "finite and >= 0");
        } else if (first < 0 || first >= capacity) {
            PyErr_Format(PyExc_ValueError, "first row %zd is outside the ring of %zd rows", first, capacity);
        } else {
            const Py_ssize_t keep = k < capacity ? k : capacity;
            const Py_ssize_t skip = k - keep;  /* the oldest rows of an add larger than the ring */
            int64_t row[SUMTREE_CHUNK];
            double *t = tree.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < keep; j += SUMTREE_CHUNK) {
                const Py_ssize_t n = keep - j < SUMTREE_CHUNK ? keep - j : SUMTREE_CHUNK;
                for (Py_ssize_t i = 0; i < n; i++)
                    row[i] = (int64_t)((first + skip + j + i) % capacity);
                set_priorities(t, L, store.buf, row, p + skip + j, n, alpha, eps);
            }
            Py_END_ALLOW_THREADS
            result = PyFloat_FromDouble(max_priority);
        }
    }
    PyBuffer_Release(&tree); PyBuffer_Release(&store); PyBuffer_Release(&pri);
    return result;
}

/* update_priorities(): raw priorities |td[j]| for held rows[j] (0 <= row < size), the last of a
 * repeated row winning. Checks every row, then every td, before writing anything. Returns
 * max(max_priority, the largest raw priority written), i.e. over the winners only, as replay.py
 * takes it. */
static PyObject *py_replay_update_priorities(PyObject *self, PyObject *args) {
    Py_buffer tree, store, idx, tdb;
    Py_ssize_t L, capacity, size;
    double alpha, eps, max_priority;
    if (!PyArg_ParseTuple(args, "w*w*y*y*nnnddd", &tree, &store, &idx, &tdb, &L, &capacity, &size, &alpha, &eps,
                          &max_priority))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t k = item_count(&idx, sizeof(int64_t), "indices");
    if (k >= 0 && check_replay(&tree, L, &store, capacity) && check_len(&tdb, k * (Py_ssize_t)sizeof(double), "td_errors")) {
        const int64_t *row = idx.buf;
        const double *td = tdb.buf;
        Py_ssize_t bad_row = -1, bad_td = -1;
        for (Py_ssize_t j = 0; j < k && bad_row < 0; j++)
            if (row[j] < 0 || row[j] >= size || row[j] >= capacity) bad_row = j;
        for (Py_ssize_t j = 0; j < k && bad_td < 0 && bad_row < 0; j++)
            if (!isfinite(td[j])) bad_td = j;
        double raw[SUMTREE_CHUNK];
        if (bad_row >= 0) {
            PyErr_Format(PyExc_ValueError, "indices[%zd] = %lld is not valid (valid: held rows 0 to %zd)",
                         bad_row, (long long)row[bad_row], size - 1);
        } else if (bad_td >= 0) {
            not_valid("td_errors", bad_td, td[bad_td], "finite; a NaN or inf loss should stop the learner");
        } else {
            double *t = tree.buf, *raw_store = store.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < k; j += SUMTREE_CHUNK) {
                const Py_ssize_t n = k - j < SUMTREE_CHUNK ? k - j : SUMTREE_CHUNK;
                for (Py_ssize_t i = 0; i < n; i++)
                    raw[i] = fabs(td[j + i]);
                set_priorities(t, L, raw_store, row + j, raw, n, alpha, eps);
            }
            /* after all writes each row holds its winner's value: the max over the winners */
            for (Py_ssize_t j = 0; j < k; j++)
                if (raw_store[row[j]] > max_priority) max_priority = raw_store[row[j]];
            Py_END_ALLOW_THREADS
            result = PyFloat_FromDouble(max_priority);
        }
    }
    PyBuffer_Release(&tree); PyBuffer_Release(&store); PyBuffer_Release(&idx); PyBuffer_Release(&tdb);
    return result;
}

/* sample(): the B stratified prefix sums (b + u[b]) * (total / B) from uniform draws u in [0, 1)
 * (drawn by the caller's numpy rng, so both paths draw the same rows), their leaves, and the
 * importance weights (size * P(i)) ** -beta over the batch's largest, as float32. */
static PyObject *py_replay_sample(PyObject *self, PyObject *args) {
    Py_buffer tree, ub, outi, outw;
    Py_ssize_t L, size;
    double beta;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nnd", &tree, &ub, &outi, &outw, &L, &size, &beta))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t B = item_count(&ub, sizeof(double), "uniforms");
    if (B >= 0 && check_tree(&tree, L) && check_len(&outi, B * (Py_ssize_t)sizeof(int64_t), "out_indices")
        && check_len(&outw, B * (Py_ssize_t)sizeof(float), "out_weights")) {
        const double *t = tree.buf, *u = ub.buf;
        int64_t *leaf = outi.buf;
        float *weight = outw.buf;
        const double total = t[1];
        if (!(isfinite(total) && total > 0)) {
            char *text = PyOS_double_to_string(total, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (text) {
                PyErr_Format(PyExc_ValueError, "the tree's total priority is %s: nothing to sample "
                             "(sampling needs a positive, finite total)", text);
                PyMem_Free(text);
            }
        } else {
            double *w = PyMem_RawMalloc((size_t)(B > 0 ? B : 1) * sizeof(double));
            if (!w) {
                PyErr_NoMemory();
            } else {
                Py_BEGIN_ALLOW_THREADS
                const double segment = total / (double)B;
                double v[SUMTREE_CHUNK], largest = 0.0;
                for (Py_ssize_t b = 0; b < B; b += SUMTREE_CHUNK) {
                    const Py_ssize_t n = B - b < SUMTREE_CHUNK ? B - b : SUMTREE_CHUNK;
                    for (Py_ssize_t i = 0; i < n; i++)
                        v[i] = ((double)(b + i) + u[b + i]) * segment;
                    sumtree_sample_chunk(t, L, v, leaf + b, n);
                    for (Py_ssize_t i = 0; i < n; i++) {
                        w[b + i] = numpy_power((double)size * (t[L + leaf[b + i]] / total), -beta);
                        if (w[b + i] > largest) largest = w[b + i];
                    }
                }
                for (Py_ssize_t b = 0; b < B; b++)
                    weight[b] = (float)(w[b] / largest);
                Py_END_ALLOW_THREADS
                PyMem_RawFree(w);
                result = Py_None;
                Py_INCREF(result);
            }
        }
    }
    PyBuffer_Release(&tree); PyBuffer_Release(&ub); PyBuffer_Release(&outi); PyBuffer_Release(&outw);
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
    {"replay_add_priorities", py_replay_add_priorities, METH_VARARGS,
     "replay_add_priorities(tree, raw_priorities, priorities, L, capacity, first, alpha, eps, max_priority) -> new max_priority"},
    {"replay_update_priorities", py_replay_update_priorities, METH_VARARGS,
     "replay_update_priorities(tree, raw_priorities, indices, td_errors, L, capacity, size, alpha, eps, max_priority) -> new max_priority"},
    {"replay_sample", py_replay_sample, METH_VARARGS,
     "replay_sample(tree, uniforms, out_indices, out_weights, L, size, beta): float64 uniforms[B], int64 out_indices[B], float32 out_weights[B]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "C kernels for GAE, V-trace and the sum-tree (see hpcrl/algos/kernels.py)", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
