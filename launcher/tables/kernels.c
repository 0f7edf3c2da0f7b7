/* Fused host-table kernels (launcher/tables/kernels.py builds this file once per compiler and loads it with ctypes).
 *
 * Plain C over fp32 tables with int64 row ids: no torch headers, so a build takes about a second. Each kernel does
 * in one pass what the torch path does in several calls (torch's per-call cost, not memory bandwidth, bounds a step
 * of many small tables): hl_coalesce sums a lookup's gradients per row (a radix sort of its ids, then each row's
 * values added in index order: torch.unique's rows and index_add_'s sums bit for bit), and hl_<optimizer> updates
 * the unique rows and states of every table a step updates with that optimizer in one call, all their rows spread
 * over OpenMP threads (each row is written by one thread) and the next rows prefetched, as FBGEMM's CPU kernels do.
 *
 * Every update reads a row's weight and states and writes the new values either in place (out == NULL) or into
 * ``out`` arrays of (n, ...) values (the deferred writes of placement.prefetch): the same arithmetic either way.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rows prefetched ahead of the one a loop is at: far enough to cover a random row's memory latency (a TLB miss and
 * a DRAM access, longer in a virtual machine). Measured interleaved in one process, 26 tables of 1 M x 16 on huge
 * pages, 1 thread (the 2-core VM of docs/performance.md): the 26 gathers of 4,096 ids 1.62 / 1.25 / 0.95 / 0.85 ms
 * at 8 / 16 / 32 / 64 rows ahead, the row-wise Adagrad updates 1.73 / 1.41 / 1.33 / 1.39, SGD's 1.26 / 0.97 /
 * 0.80 / 0.76 (FBGEMM's CPU kernels use 16). */
#define PREFETCH_AHEAD 32

/* torch's CPU kernels fuse `a + alpha * b` (add with alpha, addcmul, lerp) into one FMA where the CPU has it: so do
 * these, through fmaf, in a clone of each kernel built for FMA (picked at load time) and a portable one. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL __attribute__((target_clones("fma", "default")))
#else
#define KERNEL
#endif

/* Inlined wherever it is called (the row kernels: into each width's copy of their loop, adagrad_rows_by_width). */
#define ALWAYS __attribute__((always_inline))

static inline void prefetch_row(const float *base, int64_t row, int64_t width) {
    const char *p = (const char *)(base + row * width);
    for (int64_t b = 0; b < width * 4; b += 64) __builtin_prefetch(p + b, 1, 1);
}

/* The same for a row that is only read (a lookup's). */
static inline void prefetch_read(const float *base, int64_t row, int64_t width) {
    const char *p = (const char *)(base + row * width);
    for (int64_t b = 0; b < width * 4; b += 64) __builtin_prefetch(p + b, 0, 1);
}

/* Sort the k rows of ``keys`` (each < 2^bits) ascending with their indices ``idx``, stably (equal rows keep their
 * order): an LSD radix sort of 11 bits a pass (the counts fit the L1 cache), ``keys2``/``idx2`` k values each of
 * scratch. Returns the indices in row order and sets ``*sorted`` to the rows in that order (either pair of arrays). */
#define RADIX 11
static const int32_t *sort_rows(int64_t k, int bits, int64_t *keys, int32_t *idx, int64_t *keys2, int32_t *idx2,
                                const int64_t **sorted) {
    for (int shift = 0; shift < bits; shift += RADIX) {
        int64_t count[(1 << RADIX) + 1] = {0};
        const int64_t mask = (1 << RADIX) - 1;
        for (int64_t j = 0; j < k; ++j) ++count[((keys[j] >> shift) & mask) + 1];
        for (int b = 0; b < (1 << RADIX); ++b) count[b + 1] += count[b];
        for (int64_t j = 0; j < k; ++j) {
            int64_t at = count[(keys[j] >> shift) & mask]++;
            keys2[at] = keys[j];
            idx2[at] = idx[j];
        }
        int64_t *tk = keys; keys = keys2; keys2 = tk;
        int32_t *ti = idx; idx = idx2; idx2 = ti;
    }
    *sorted = keys;
    return idx;
}

/* -(i + 1) for the first of ``ids`` not in [0, rows), else 0; ``*bits``: how many bits the largest needs. */
static int64_t check_ids(const int64_t *ids, int64_t n, int64_t rows, int *bits) {
    int64_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= rows) return -(i + 1);
        top |= ids[i];
    }
    for (*bits = 0; *bits < 63 && (top >> *bits) != 0; ++*bits) {}
    return 0;
}

static int64_t distinct(const int64_t *sorted, int64_t k) {
    int64_t out = 0;
    for (int64_t p = 0; p < k; ++p) out += p == 0 || sorted[p] != sorted[p - 1];
    return out;
}

/* What a coalesce sums: ``m`` arrays of values over the same ids (tables looked up with one ids tensor: one sort
 * serves them all), array j (n x d[j], rows stride[j] values apart: a column slice is read in place) summed into
 * sums[j], its distinct rows written to unique[j]. */
typedef struct {
    int64_t m;
    const float *const *values;
    const int64_t *d, *stride;
    int64_t *const *unique;
    float *const *sums;
} Sums;

/* Whether each of the n values at v is finite. */
static inline int finite_span(const float *v, int64_t n) {
    int here = 1;
    for (int64_t i = 0; i < n; ++i) here &= isfinite(v[i]) != 0;
    return here;
}

/* ok[a] &= whether every value of rows [from, to) of ``s``'s sums array a is finite, for each of its arrays: the
 * finiteness check of a step's gradients, fused into the coalesce that just wrote them (still in cache). */
static void finite_rows(const Sums *s, int64_t from, int64_t to, int *ok) {
    for (int64_t a = 0; a < s->m; ++a) ok[a] &= finite_span(s->sums[a] + from * s->d[a], (to - from) * s->d[a]);
}

/* The sums of sorted ids' values, each made in one place from the values its ids point at, read ahead: sequential
 * writes and prefetched reads (adding each id into a hashed row's sum instead wrote all over the sums: 2-3x the
 * time, measured). The first distinct row goes to position ``at``; returns how many distinct rows it wrote, and
 * ok[a] &= whether every value of array a's sums is finite. */
static int64_t sum_sorted_one(const int64_t *sorted, const int32_t *order, int64_t k, const Sums *s, int64_t at,
                              int *ok);

static int64_t sum_sorted(const int64_t *sorted, const int32_t *order, int64_t k, const Sums *s, int64_t at,
                          int *ok) {
    if (s->m == 1) return sum_sorted_one(sorted, order, k, s, at, ok);
    int64_t u = at - 1, last = -1;
    for (int64_t p = 0; p < k; ++p) {
        for (int64_t a = 0; a < s->m && p + PREFETCH_AHEAD < k; ++a) /* rows pages apart: no hardware prefetch */
            for (int64_t b = 0; b < s->d[a] * 4; b += 64)
                __builtin_prefetch((const char *)(s->values[a] + order[p + PREFETCH_AHEAD] * s->stride[a]) + b, 0, 1);
        const int fresh = sorted[p] != last;
        if (fresh) {
            last = sorted[p];
            ++u;
        }
        for (int64_t a = 0; a < s->m; ++a) {
            const int64_t d = s->d[a];
            const float *v = s->values[a] + order[p] * s->stride[a];
            float *out = s->sums[a] + u * d;
            if (fresh) {
                s->unique[a][u] = last;
                for (int64_t j = 0; j < d; ++j) out[j] = 0.0f + v[j];
            } else {
                for (int64_t j = 0; j < d; ++j) out[j] += v[j];
            }
        }
    }
    finite_rows(s, at, u + 1, ok);
    return u + 1 - at;
}

/* ``sum_sorted`` of one array (a table looked up with ids of its own: the common case), its pointers, width and
 * stride held in locals the compiler keeps in registers (the loop over arrays above reloads them from ``s`` for
 * every id), and each row's sum checked for finiteness once it is complete, while it is in the L1 cache, not in a
 * pass of its own over the sums: store.step() 1.07-1.14x faster (1 and 2 threads, 26 x 1 M x 16 and 8 x 4 M x 64;
 * bench/kernels_ab.py, bench/results/kernels_before_after.txt). */
static int64_t sum_sorted_one(const int64_t *sorted, const int32_t *order, int64_t k, const Sums *s, int64_t at,
                              int *ok) {
    const int64_t d = s->d[0], stride = s->stride[0];
    const float *const values = s->values[0];
    int64_t *const unique = s->unique[0];
    float *const sums = s->sums[0];
    float *restrict out = sums;
    int64_t u = at - 1, last = -1;
    int finite = 1;
    for (int64_t p = 0; p < k; ++p) {
        if (p + PREFETCH_AHEAD < k)
            for (int64_t b = 0; b < d * 4; b += 64)
                __builtin_prefetch((const char *)(values + order[p + PREFETCH_AHEAD] * stride) + b, 0, 1);
        const float *restrict v = values + order[p] * stride;
        if (sorted[p] != last) {
            if (u >= at) finite &= finite_span(out, d); /* the row before is complete */
            last = sorted[p];
            unique[++u] = last;
            out = sums + u * d;
            for (int64_t j = 0; j < d; ++j) out[j] = 0.0f + v[j];
        } else {
            for (int64_t j = 0; j < d; ++j) out[j] += v[j];
        }
    }
    if (u >= at) finite &= finite_span(out, d);
    ok[0] &= finite;
    return u + 1 - at;
}

/* Sum each of ``s``'s arrays per row of ``ids`` (n). ``scratch`` holds 2n int64 and 2n int32. Writes the distinct
 * rows in ascending order (an update then walks the table in address order: about half the time of the order the
 * ids came in, measured) and their sums, each row's values added in index order (the sums of torch's index_add_ bit
 * for bit); returns how many, or -(i + 1) when ids[i] is not in [0, rows). The ids are radix-sorted (stable: a row's
 * ids stay in index order), then summed (``sum_sorted``, which also ands each array's finiteness into ok[a]). */
static int64_t hl_coalesce(const int64_t *ids, int64_t n, int64_t rows, void *scratch, const Sums *s, int *ok) {
    int64_t *keys = scratch, *keys2 = keys + n;
    int32_t *idx = (int32_t *)(keys2 + n), *idx2 = idx + n;
    int bits;
    int64_t bad = check_ids(ids, n, rows, &bits);
    if (bad) return bad;
    for (int64_t i = 0; i < n; ++i) {
        keys[i] = ids[i];
        idx[i] = (int32_t)i;
    }
    const int64_t *sorted;
    const int32_t *order = sort_rows(n, bits, keys, idx, keys2, idx2, &sorted);
    return sum_sorted(sorted, order, n, s, 0, ok);
}

/* ``hl_coalesce`` of one lookup over ``threads`` threads, the same rows and sums: its ids split by their top RADIX
 * bits into ``threads`` ranges of about n / threads ids each (the first pass of a radix sort from the top), each
 * range sorted and summed by one thread into its place, the ranges' rows ascending one after another. */
static int64_t coalesce_split(const int64_t *ids, int64_t n, int64_t rows, void *scratch, const Sums *s,
                              int threads, int *finite) { /* finite: s->m flags, each 1 on entry */
    int64_t *keys = scratch, *keys2 = keys + n;
    int32_t *idx = (int32_t *)(keys2 + n), *idx2 = idx + n;
    int bits;
    int64_t bad = check_ids(ids, n, rows, &bits);
    if (bad) return bad;
    const int high = bits > RADIX ? bits - RADIX : 0;
    int64_t start[(1 << RADIX) + 1] = {0};
    for (int64_t i = 0; i < n; ++i) ++start[(ids[i] >> high) + 1];
    for (int b = 0; b < (1 << RADIX); ++b) start[b + 1] += start[b];
    int cut[threads + 1];
    int64_t kept[threads + 1];
    cut[0] = 0;
    cut[threads] = 1 << RADIX;
    for (int t = 1, b = 0; t < threads; ++t) {
        while (b < (1 << RADIX) && start[b] < n * t / threads) ++b;
        cut[t] = b;
    }
    kept[0] = 0;
    const int64_t *sorted[threads];
    const int32_t *order[threads];
    int ok[threads][s->m]; /* each thread's finiteness of its rows, per array */
#pragma omp parallel num_threads(threads)
    {
        int64_t next[1 << RADIX];
        for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads()) {
            int64_t lo = start[cut[t]], hi = start[cut[t + 1]];
            memcpy(next + cut[t], start + cut[t], (size_t)(cut[t + 1] - cut[t]) * sizeof(int64_t));
            for (int64_t i = 0; i < n; ++i) { /* this range's ids, in index order */
                int64_t b = ids[i] >> high;
                if (b >= cut[t] && b < cut[t + 1]) {
                    keys[next[b]] = ids[i];
                    idx[next[b]++] = (int32_t)i;
                }
            }
            order[t] = sort_rows(hi - lo, bits, keys + lo, idx + lo, keys2 + lo, idx2 + lo, &sorted[t]);
            kept[t + 1] = distinct(sorted[t], hi - lo);
        }
#pragma omp barrier
        for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads()) {
            int64_t at = 0;
            for (int u = 0; u <= t; ++u) at += kept[u];
            for (int64_t a = 0; a < s->m; ++a) ok[t][a] = 1;
            sum_sorted(sorted[t], order[t], start[cut[t + 1]] - start[cut[t]], s, at, ok[t]);
        }
    }
    int64_t k = 0;
    for (int t = 0; t < threads; ++t) {
        k += kept[t + 1];
        for (int64_t a = 0; a < s->m; ++a) finite[a] &= ok[t][a];
    }
    return k;
}

/* One run's coalesce (parts ``first`` to ``first + m - 1`` of hl_coalesce_many, which share their ids) into their
 * ``found`` (over ``threads`` threads when more than 1); 1 when its scratch could not be had, else 0. */
static int coalesce_run(int64_t first, int64_t m, const int64_t *const *ids, const int64_t *n,
                        const float *const *values, const int64_t *d, const int64_t *stride, int64_t rows,
                        int64_t *const *unique, float *const *sums, int64_t *found, int64_t *finite, int threads) {
    const Sums s = {m, values + first, d + first, stride + first, unique + first, sums + first};
    void *scratch = malloc((size_t)n[first] * (2 * sizeof(int64_t) + 2 * sizeof(int32_t)) + 1);
    if (!scratch) return 1;
    int ok[m];
    for (int64_t a = 0; a < m; ++a) ok[a] = 1;
    int64_t k = threads > 1 ? coalesce_split(ids[first], n[first], rows, scratch, &s, threads, ok)
                            : hl_coalesce(ids[first], n[first], rows, scratch, &s, ok);
    free(scratch);
    for (int64_t a = 0; a < m; ++a) {
        found[first + a] = k;
        finite[first + a] = k >= 0 && ok[a];
    }
    return 0;
}

/* hl_coalesce of ``count`` lookups at once: consecutive parts with the same ids (one tensor: tables looked up
 * together) sorted once, the runs spread over threads (each one's sums still added in index order), or, when there
 * are fewer runs than threads, each one of SPLIT_MIN ids or more split over them in turn (``coalesce_split``):
 * found[t] = part t's distinct rows, or -(i + 1) for an id out of range; finite[t] = 1 when every value of part t's
 * sums is finite (``finite_rows``), else 0. 0, or -1 when scratch could not be had. */
#define SPLIT_MIN (1 << 14)
int64_t hl_coalesce_many(int64_t count, const int64_t *const *ids, const int64_t *n, const float *const *values,
                         const int64_t *d, const int64_t *stride, int64_t rows, int64_t *const *unique,
                         float *const *sums, int64_t *found, int64_t *finite, int threads) {
    int64_t starts[count + 1], runs = 0;
    for (int64_t t = 0; t < count; ++t)
        if (t == 0 || ids[t] != ids[t - 1] || n[t] != n[t - 1]) starts[runs++] = t;
    starts[runs] = count;
    int failed = 0;
    if (runs < threads) {
        for (int64_t r = 0; r < runs; ++r)
            failed |= coalesce_run(starts[r], starts[r + 1] - starts[r], ids, n, values, d, stride, rows, unique,
                                   sums, found, finite, n[starts[r]] >= SPLIT_MIN ? threads : 1);
        return failed ? -1 : 0;
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(| : failed)
    for (int64_t r = 0; r < runs; ++r)
        failed |= coalesce_run(starts[r], starts[r + 1] - starts[r], ids, n, values, d, stride, rows, unique, sums,
                               found, finite, 1);
    return failed ? -1 : 0;
}

/* Check that every row is in [0, rows): -(i + 1) for the first that is not, else 0. */
static int64_t check_rows(const int64_t *rows, int64_t n, int64_t limit) {
    for (int64_t i = 0; i < n; ++i)
        if (rows[i] < 0 || rows[i] >= limit) return -(i + 1);
    return 0;
}

/* One table's update (kernels.py Job, its fields in this order): the table ``w`` (table_rows x d) and up to two
 * states, the ``n`` unique rows to update and their gradients ``g`` (n x d), the optimizer's constants ``c`` and
 * flags. Each new value goes in place (o == NULL) or into row i of an (n, ...) output (the deferred writes of
 * placement.prefetch): the same arithmetic either way. */
typedef struct {
    float *w, *s1, *s2;
    float *ow, *o1, *o2;
    const int64_t *rows;
    const float *g;
    int64_t table_rows, n, d;
    float c[8];
    int32_t flag[2];
} Job;

/* Where row i of a job's (rows, width) tensor ``t`` goes: its output row, or the row itself. */
static inline float *dest(const Job *j, float *t, float *o, int64_t i, int64_t width) {
    return o ? o + i * width : t + j->rows[i] * width;
}

/* torch.optim.SGD's step on rows (SparseSGD): L2 decay, then momentum (buffer = grad on the first step), Nesterov.
 * c: lr, momentum, undamped (1 - dampening, computed in double as torch's alpha is), decay; flag: nesterov, first. */
static inline ALWAYS void sgd_row(const Job *job, int64_t i, const int64_t d) {
    float *buf = job->s1;
    if (i + PREFETCH_AHEAD < job->n) {
        prefetch_row(job->w, job->rows[i + PREFETCH_AHEAD], d);
        if (buf) prefetch_row(buf, job->rows[i + PREFETCH_AHEAD], d);
    }
    const float lr = job->c[0], momentum = job->c[1], undamped = job->c[2], decay = job->c[3];
    const int nesterov = job->flag[0], first = job->flag[1];
    const float *wr = job->w + job->rows[i] * d, *gr = job->g + i * d;
    float *ow = dest(job, job->w, job->ow, i, d);
    const float *br = buf ? buf + job->rows[i] * d : NULL;
    float *ob = buf ? dest(job, buf, job->o1, i, d) : NULL;
    for (int64_t j = 0; j < d; ++j) {
        float gj = gr[j], wj = wr[j];
        if (decay != 0.0f) gj = fmaf(decay, wj, gj);
        if (buf) {
            float b = first ? gj : fmaf(undamped, gj, br[j] * momentum);
            ob[j] = b;
            gj = nesterov ? fmaf(momentum, b, gj) : b;
        }
        ow[j] = fmaf(-lr, gj, wj);
    }
}

/* One row of lazy Adam; ``l2``, ``decoupled`` and ``low`` (w1 < 0.5: torch.lerp's branch) are constants at each call,
 * so each of the loop's versions has no branch and vectorizes. */
static inline ALWAYS void adam_values(const float *wr, const float *mr, const float *gr, float *ow, float *om,
                                      int64_t d, float w1, float beta2, float w2, float eps, float decay, float keep,
                                      float step_size, const int l2, const int decoupled, const int low) {
#pragma GCC ivdep /* a row is read, then written at the same index: no carried dependency */
    for (int64_t j = 0; j < d; ++j) {
        float wj = wr[j], gj = gr[j];
        if (l2) gj = fmaf(decay, wj, gj);
        float m = mr[j], v = mr[d + j];
        m = low ? fmaf(w1, gj - m, m) : fmaf(gj - m, -(1.0f - w1), gj); /* torch.lerp */
        v = fmaf(w2 * gj, gj, v * beta2);                                /* addcmul */
        if (decoupled) wj = wj * keep;
        om[j] = m;
        om[d + j] = v;
        ow[j] = fmaf(-step_size, m / (sqrtf(v) + eps), wj);
    }
}

/* Lazy Adam (LazyAdam): moments interleaved per row as (2, d). c: w1 = 1 - beta1, beta2, w2 = 1 - beta2, eps, decay,
 * keep = 1 - lr * decay (decoupled decay), step_size = lr * sqrt(1 - b2^t) / (1 - b1^t), each computed in double as
 * torch's Python scalars are; flag: decoupled. */
static inline ALWAYS void adam_row(const Job *job, int64_t i, const int64_t d) {
    if (i + PREFETCH_AHEAD < job->n) {
        prefetch_row(job->w, job->rows[i + PREFETCH_AHEAD], d);
        prefetch_row(job->s1, job->rows[i + PREFETCH_AHEAD], 2 * d);
    }
    const float *c = job->c, decay = c[4];
    const int decoupled = job->flag[0], l2 = decay != 0.0f && !decoupled, dec = decay != 0.0f && decoupled;
    const int low = c[0] < 0.5f;
    const float *wr = job->w + job->rows[i] * d, *mr = job->s1 + job->rows[i] * 2 * d, *gr = job->g + i * d;
    float *ow = dest(job, job->w, job->ow, i, d), *om = dest(job, job->s1, job->o1, i, 2 * d);
    if (low && !l2 && !dec)
        adam_values(wr, mr, gr, ow, om, d, c[0], c[1], c[2], c[3], decay, c[5], c[6], 0, 0, 1);
    else if (low && l2)
        adam_values(wr, mr, gr, ow, om, d, c[0], c[1], c[2], c[3], decay, c[5], c[6], 1, 0, 1);
    else if (low)
        adam_values(wr, mr, gr, ow, om, d, c[0], c[1], c[2], c[3], decay, c[5], c[6], 0, 1, 1);
    else
        adam_values(wr, mr, gr, ow, om, d, c[0], c[1], c[2], c[3], decay, c[5], c[6], l2, dec, 0);
}

/* One row of FTRL; ``root`` (p = 0.5: sqrt, as torch's pow takes it) is a constant at each call. */
static inline ALWAYS void ftrl_values(const float *wr, const float *nr, const float *zr, const float *gr, float *ow,
                                      float *on, float *oz, int64_t d, float lr, float l1, float l2, float p,
                                      const int root) {
#pragma GCC ivdep /* a row is read, then written at the same index: no carried dependency */
    for (int64_t j = 0; j < d; ++j) {
        float gj = gr[j], wj = wr[j], nj = nr[j], zj = zr[j];
        float n_new = nj + gj * gj;
        float n_pow = root ? sqrtf(nj) : powf(nj, p), n_new_pow = root ? sqrtf(n_new) : powf(n_new, p);
        zj = zj + (gj - (n_new_pow - n_pow) / lr * wj);
        float quadratic = n_new_pow / lr + 2.0f * l2;
        float sign = (float)(zj > 0.0f) - (float)(zj < 0.0f); /* torch.sign, branch-free */
        float w_new = (sign * l1 - zj) / quadratic;
        ow[j] = w_new * (float)(fabsf(zj) > l1) + 0.0f; /* torch.where(|z| > l1, w_new, 0): no branch to mispredict */
        on[j] = n_new;
        oz[j] = zj;
    }
}

/* FTRL-Proximal (SparseFTRL): states accum (n) and linear (z). c: lr, l1, l2, p = -lr_power. */
static inline ALWAYS void ftrl_row(const Job *job, int64_t i, const int64_t d) {
    const int64_t at = job->rows[i] * d;
    if (i + PREFETCH_AHEAD < job->n) {
        const int64_t ahead = job->rows[i + PREFETCH_AHEAD];
        prefetch_row(job->w, ahead, d);
        prefetch_row(job->s1, ahead, d);
        prefetch_row(job->s2, ahead, d);
    }
    const float *c = job->c;
    float *ow = dest(job, job->w, job->ow, i, d), *on = dest(job, job->s1, job->o1, i, d);
    float *oz = dest(job, job->s2, job->o2, i, d);
    if (c[3] == 0.5f)
        ftrl_values(job->w + at, job->s1 + at, job->s2 + at, job->g + i * d, ow, on, oz, d, c[0], c[1], c[2], c[3], 1);
    else
        ftrl_values(job->w + at, job->s1 + at, job->s2 + at, job->g + i * d, ow, on, oz, d, c[0], c[1], c[2], c[3], 0);
}

/* The sum of a row's squared gradients (L2 decay added first): eight running sums, added pairwise at the end, so
 * that the loop vectorizes (one running sum is a chain of d dependent adds: most of a row-wise update's time at
 * d = 64). The same order at every call: deterministic, within rounding of torch's own sum. */
static inline ALWAYS float row_squares(const float *wr, const float *gr, int64_t d, float decay) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = 0;
    if (decay == 0.0f) {
        for (; j + 8 <= d; j += 8)
            for (int l = 0; l < 8; ++l) acc[l] += gr[j + l] * gr[j + l];
    } else {
        for (; j + 8 <= d; j += 8)
            for (int l = 0; l < 8; ++l) {
                float g = fmaf(decay, wr[j + l], gr[j + l]);
                acc[l] += g * g;
            }
    }
    float tail = 0.0f;
    for (; j < d; ++j) {
        float g = decay != 0.0f ? fmaf(decay, wr[j], gr[j]) : gr[j];
        tail += g * g;
    }
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

/* Adagrad (torch.optim.Adagrad without lr_decay; FBGEMM's EXACT_ADAGRAD): state += g^2, w -= lr g / (sqrt(state) +
 * eps). flag rowwise: one state per row, += mean(g^2) (FBGEMM's EXACT_ROWWISE_ADAGRAD; adagrad_rows_d). L2 decay into
 * g first. c: lr, eps, decay. This is one row of the element-wise one. */
static inline ALWAYS void adagrad_row(const Job *job, int64_t i, const int64_t d) {
    if (i + PREFETCH_AHEAD < job->n) {
        prefetch_row(job->w, job->rows[i + PREFETCH_AHEAD], d);
        prefetch_row(job->s1, job->rows[i + PREFETCH_AHEAD], d);
    }
    const float lr = job->c[0], eps = job->c[1], decay = job->c[2];
    const float *wr = job->w + job->rows[i] * d, *sr = job->s1 + job->rows[i] * d, *gr = job->g + i * d;
    float *ow = dest(job, job->w, job->ow, i, d), *os = dest(job, job->s1, job->o1, i, d);
    for (int64_t j = 0; j < d; ++j) {
        float wj = wr[j], gj = decay != 0.0f ? fmaf(decay, wj, gr[j]) : gr[j];
        float s = fmaf(gj, gj, sr[j]);
        os[j] = s;
        ow[j] = fmaf(-lr, gj / (sqrtf(s) + eps), wj);
    }
}

/* Rows of all jobs together below which the threads are not woken (a few microseconds each time). */
#define UPDATE_SPREAD_MIN 256

/* hl_<name>: the updates of ``count`` tables at once, the ``row`` of each of their rows. Every job's rows are checked
 * first (nothing is written when one is out of range: -(i + 1) for the i-th row of all the jobs' rows in order),
 * then all the rows, one job's after another, split over the threads in equal contiguous shares (one wake-up for a
 * step's tables: one call per table cost ~10 us of Python and a wake-up each, most of a step of 26 small tables at
 * two threads). Each row is written by one thread: the result does not depend on the thread count. */
#define UPDATE_MANY(name, each)                                                                                   \
    KERNEL int64_t hl_##name(int64_t count, const Job *jobs, int threads) {                                       \
        int64_t start[count + 1];                                                                                 \
        start[0] = 0;                                                                                             \
        for (int64_t k = 0; k < count; ++k) {                                                                     \
            int64_t bad = check_rows(jobs[k].rows, jobs[k].n, jobs[k].table_rows);                                \
            if (bad) return bad - start[k];                                                                       \
            start[k + 1] = start[k] + jobs[k].n;                                                                  \
        }                                                                                                         \
        const int64_t total = start[count];                                                                       \
        _Pragma("omp parallel num_threads(threads) if (total >= UPDATE_SPREAD_MIN)")                              \
        {                                                                                                         \
            const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();                                   \
            const int64_t lo = total * t / nt, hi = total * (t + 1) / nt;                                         \
            for (int64_t k = 0, at = lo; at < hi; ++k) {                                                          \
                if (start[k + 1] <= at) continue;                                                                 \
                const int64_t end = (hi < start[k + 1] ? hi : start[k + 1]) - start[k];                           \
                each(&jobs[k], at - start[k], end, jobs[k].d);                                                    \
                at = start[k + 1];                                                                                \
            }                                                                                                     \
        }                                                                                                         \
        return 0;                                                                                                 \
    }

/* name##s_d(job, from, to, d): rows [from, to) of a job, one ``name`` call a row. */
#define EACH_ROW(name)                                                                                            \
    static inline ALWAYS void name##s_d(const Job *job, int64_t from, int64_t to, const int64_t d) {              \
        for (int64_t i = from; i < to; ++i) name(job, i, d);                                                      \
    }
EACH_ROW(sgd_row)
EACH_ROW(adam_row)
EACH_ROW(ftrl_row)

/* Rows of a row-wise Adagrad pass at a time (adagrad_rows_d): 128 against 32, 8 and one at a time, 1.0 / 1.05 / 1.15 /
 * 1.45 ms for 8 tables of 4 M x 64, 2,200 rows each (a C loop over the same jobs, one thread, 2026-12-02). */
#define ROWWISE_CHUNK 128

/* Adagrad over rows [from, to). Row-wise, ROWWISE_CHUNK rows at a time: first each row's state and multiplier, then
 * the rows' writes. A row's multiplier is a chain of dependent adds (its squares' sum), a square root and a division;
 * the rows' chains are independent, and in a loop of their own the CPU overlaps them, where one row's chain and then
 * its writes, row after row, left it waiting on each chain in turn (a third of the time of that update). The same
 * arithmetic in the same order: the same values. */
static inline ALWAYS void adagrad_rows_d(const Job *job, int64_t from, int64_t to, const int64_t d) {
    if (!job->flag[0]) {
        for (int64_t i = from; i < to; ++i) adagrad_row(job, i, d);
        return;
    }
    const float lr = job->c[0], eps = job->c[1], decay = job->c[2];
    float mult[ROWWISE_CHUNK];
    for (int64_t c0 = from; c0 < to; c0 += ROWWISE_CHUNK) {
        const int64_t c1 = c0 + ROWWISE_CHUNK < to ? c0 + ROWWISE_CHUNK : to;
        for (int64_t i = c0; i < c1; ++i) {
            if (i + PREFETCH_AHEAD < job->n) {
                prefetch_row(job->w, job->rows[i + PREFETCH_AHEAD], d);
                prefetch_row(job->s1, job->rows[i + PREFETCH_AHEAD], 1);
            }
            const float *wr = job->w + job->rows[i] * d, *gr = job->g + i * d;
            const float s = job->s1[job->rows[i]] + row_squares(wr, gr, d, decay) / (float)d;
            *dest(job, job->s1, job->o1, i, 1) = s;
            mult[i - c0] = lr / (sqrtf(s) + eps);
        }
        for (int64_t i = c0; i < c1; ++i) {
            const float *wr = job->w + job->rows[i] * d, *gr = job->g + i * d;
            float *ow = dest(job, job->w, job->ow, i, d);
            const float m = mult[i - c0];
            if (decay == 0.0f) {
                for (int64_t j = 0; j < d; ++j) ow[j] = wr[j] - m * gr[j];
            } else {
                for (int64_t j = 0; j < d; ++j) ow[j] = wr[j] - m * fmaf(decay, wr[j], gr[j]);
            }
        }
    }
}

/* adagrad_rows_d with d = 64 a constant where the rows are row-wise and 64 wide: the compiler then unrolls and
 * vectorizes the rows' loops for it, the same operations in the same order. There only, where it was measured to
 * gain: row-wise Adagrad's update of 8 tables of 4 M x 64 in the store 0.72-0.91 ms against 0.90-1.08 (one thread),
 * 0.42-0.68 against 0.52-0.83 (two), 2026-12-02. At 16 the constant lost: row-wise Adagrad's update of 26 tables of
 * 1 M x 16 1.13-1.15 against 0.90-1.03 ms, SGD's 1.57 against 0.62-0.78. */
static inline void adagrad_rows_by_width(const Job *job, int64_t from, int64_t to, const int64_t d) {
    if (job->flag[0] && d == 64)
        adagrad_rows_d(job, from, to, 64);
    else
        adagrad_rows_d(job, from, to, d);
}

UPDATE_MANY(sgd, sgd_rows_d)
UPDATE_MANY(lazy_adam, adam_rows_d)
UPDATE_MANY(ftrl, ftrl_rows_d)
UPDATE_MANY(adagrad, adagrad_rows_by_width)

/* out[i] = table[rows[i]] (n rows of d values), rows prefetched ahead, spread over threads: the forward gather of a
 * host table. -(i + 1) when rows[i] is not in [0, table_rows). */
int64_t hl_gather(const float *table, int64_t table_rows, const int64_t *rows, int64_t n, int64_t d, float *out,
                  int threads) {
    int64_t bad = check_rows(rows, n, table_rows);
    if (bad) return bad;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * d >= 32768)
    for (int64_t i = 0; i < n; ++i) {
        if (i + PREFETCH_AHEAD < n) prefetch_read(table, rows[i + PREFETCH_AHEAD], d);
        memcpy(out + i * d, table + rows[i] * d, (size_t)d * 4);
    }
    return 0;
}

/* 1 when every value of the ``count`` arrays (array a: n[a] values) is finite, else 0: the arrays in chunks of
 * 2^16 values over the threads (one call for a step's tables: 26 calls of the single-array check cost 0.8 ms of
 * Python on this VM, and ran on one thread). */
#define FINITE_CHUNK (1 << 16)
static inline int64_t chunks_of(int64_t n) { return (n + FINITE_CHUNK - 1) / FINITE_CHUNK; }

int64_t hl_all_finite(int64_t count, const float *const *x, const int64_t *n, int threads) {
    int64_t chunks = 0;
    for (int64_t a = 0; a < count; ++a) chunks += chunks_of(n[a]);
    int ok = 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(& : ok) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t a = 0, first = c; /* chunk c is array a's chunk ``first`` */
        while (first >= chunks_of(n[a])) first -= chunks_of(n[a++]);
        const float *v = x[a] + first * FINITE_CHUNK;
        const int64_t left = n[a] - first * FINITE_CHUNK, m = left < FINITE_CHUNK ? left : FINITE_CHUNK;
        int here = 1;
        for (int64_t i = 0; i < m; ++i) here &= isfinite(v[i]) != 0;
        ok &= here;
    }
    return ok;
}

/* The pooled forward of many features at once (a TorchRec EmbeddingBagCollection's: lookup.py batch_collections),
 * as FBGEMM's table-batched forward: feature f sums, per bag b of the ``bags`` its key has, the rows of table
 * ``tables[f]`` (``d[f]`` values each) that ids[offsets[key[f] * bags + b] .. offsets[key[f] * bags + b + 1]) name
 * into out[b, col[f] .. col[f] + d[f]) (rows ``stride`` values apart), in id order from zero (index_add_'s sums, bit
 * for bit; a bag of one id is its row, as 0 + row is); an empty bag is zeros. ``single[f]``: 1 when every bag of f
 * held exactly one id. Features spread over threads, each feature's bags in order, the rows of the ids ahead
 * prefetched. (Bags by tiles of 64, every feature's rows of a tile before the next, kept a tile's output lines in
 * cache but ran 1.5x slower: each tile jumps across all the tables.) 0, or -(i + 1) for the first id out of its
 * table's range (i: its place in ids), checked before anything is read. */
int64_t hl_pool_many(int64_t count, const float *const *tables, const int64_t *table_rows, const int64_t *d,
                     const int64_t *key, const int64_t *col, const int64_t *ids, const int64_t *offsets, int64_t bags,
                     float *out, int64_t stride, int64_t *single, int threads) {
    for (int64_t f = 0; f < count; ++f) {
        const int64_t *bounds = offsets + key[f] * bags;
        int64_t wrong = check_rows(ids + bounds[0], bounds[bags] - bounds[0], table_rows[f]), one = 1;
        if (wrong) return wrong - bounds[0];
        for (int64_t b = 0; b < bags; ++b) one &= bounds[b + 1] - bounds[b] == 1;
        single[f] = one;
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t f = 0; f < count; ++f) {
        const int64_t *bounds = offsets + key[f] * bags, last = bounds[bags];
        const float *table = tables[f];
        int64_t width = d[f];
        if (single[f]) { /* a row a bag (one id per feature and sample, as in Criteo): copied, 0 + x being x */
            const int64_t *at = ids + bounds[0];
            for (int64_t b = 0; b < bags; ++b) {
                if (b + PREFETCH_AHEAD < bags) prefetch_read(table, at[b + PREFETCH_AHEAD], width);
                memcpy(out + b * stride + col[f], table + at[b] * width, (size_t)width * sizeof(float));
            }
            continue;
        }
        for (int64_t b = 0; b < bags; ++b) {
            float *o = out + b * stride + col[f];
            int64_t s = bounds[b], e = bounds[b + 1];
            memset(o, 0, (size_t)width * sizeof(float));
            for (int64_t i = s; i < e; ++i) {
                if (i + PREFETCH_AHEAD < last) prefetch_read(table, ids[i + PREFETCH_AHEAD], width);
                const float *row = table + ids[i] * width;
                for (int64_t j = 0; j < width; ++j) o[j] += row[j];
            }
        }
    }
    return 0;
}
