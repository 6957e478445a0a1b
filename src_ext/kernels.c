/* hpcrl._kernels: the hot numeric loops over [T, N] fragments, in C.
 *
 * gae()    generalised advantage estimation (same recursion as hpcrl/algos/gae.py)
 * vtrace() V-trace targets and policy-gradient advantages (hpcrl/algos/vtrace.py)
 *
 * Arrays arrive as C-contiguous buffers (hpcrl/algos/kernels.py checks dtypes and shapes and
 * allocates the outputs); the loops run with the GIL released. Time runs backwards over t, and
 * the inner loop over the N envs is contiguous, so the compiler can vectorise it.
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

static PyMethodDef methods[] = {
    {"gae", py_gae, METH_VARARGS,
     "gae(rewards, values, next_values, dones, out_advantages, T, N, gamma, lam)"},
    {"vtrace", py_vtrace, METH_VARARGS,
     "vtrace(log_rhos, rewards, values, next_values, dones, out_vs, out_pg, T, N, gamma, rho_bar, c_bar, lam)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "C kernels for GAE and V-trace (see hpcrl/algos/kernels.py)", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
