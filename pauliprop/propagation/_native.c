/* The native CPU engine's loops over words (pauliprop/propagation/native.py loads this library with ctypes and
 * drives it): compiled once when the package is installed, so a process's first call compiles nothing.
 *
 * Buffers (numpy arrays, C order, owned by native.py): 2^k buckets of cap slots, slots = cap << k;
 *   words  (slots, 2W) uint32: x lanes, then z lanes (qubit q: bit q % 32 of lane q / 32)
 *   coeffs (slots,) CT: the coefficient type (float64 or float32: each unit exists once per type, from
 *          _native_kernels.h, suffixed _f64 / _f32), sins (slots,) int32, gone (slots,) uint8,
 *   holes, partner, turning (slots,) int32, table (4 cap,) int64 (-1: empty), bucket counts (2^k,) int64.
 * Every function's arithmetic is the one native.py documents, operation for operation (the same roundings:
 * products of two coefficients in CT, anything with a sign or a float64 limit in double), so its values
 * and truncation decisions equal the tiled engine's. The functions hold no Python object (ctypes calls them with
 * the GIL released); rotations_threads runs a unit's rotations on OpenMP's threads where the compiler has it. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef int64_t i64;
typedef int32_t i32;
typedef uint32_t u32;
typedef uint64_t u64;
typedef uint8_t u8;

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

enum { TABLE = 0 }; /* schedule.TABLE: a Clifford row given by its 16-entry table on one or two qubits */
enum { RANGES_PER_THREAD = 8 }; /* a threaded rotation's ranges of buckets (pairs) for each thread, handed out as
                                 * threads come free (one H200 host's 16 cores, 2026-11-29, warm: 2D Ising 8x8
                                 * 3.56-3.68 s with a range a thread, 3.04-3.67 s so; 6x6 2.63-2.85, 2.47-2.78) */

/* set bits of a value below 2^32 */
static inline i64 pop(i64 v) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_popcount((u32)v);
#else
    u32 x = (u32)v;
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    x = (x + (x >> 4)) & 0x0F0F0F0Fu;
    return (i64)((x * 0x01010101u) >> 24);
#endif
}

/* Pauli weight of a word */
static inline i64 weight(const u32 *word, i64 w) {
    i64 t = 0;
    for (i64 l = 0; l < w; l++) t += pop(word[l] | word[w + l]);
    return t;
}

/* The lanes where G has a bit (x or z), listed in lanes; their number. Anticommutation and the product's sign
 * are sums over lanes in which G's empty lanes add nothing: a generator on one or two qubits reads one or two
 * lanes of each word, not all of them (5,000 qubits: 157 lanes). */
static i64 gen_lanes(const u32 *gen, i64 w, i64 *lanes) {
    i64 n = 0;
    for (i64 l = 0; l < w; l++)
        if (gen[l] | gen[w + l]) lanes[n++] = l;
    return n;
}

static inline int anticommutes(const u32 *word, const u32 *gen, i64 w, const i64 *lanes, i64 nl) {
    u32 par = 0;
    for (i64 k = 0; k < nl; k++) {
        i64 l = lanes[k];
        par ^= (word[l] & gen[w + l]) ^ (word[w + l] & gen[l]);
    }
    return (int)(pop(par) & 1);
}

/* s with i G P = s (P xor G) for anticommuting P and G (words.product_sign; a lane where G is empty adds
 * pop(x & z) - pop(x & z) = 0) */
static inline double product_sign(const u32 *word, const u32 *gen, i64 w, const i64 *lanes, i64 nl) {
    i64 e = 0;
    for (i64 k = 0; k < nl; k++) {
        i64 l = lanes[k];
        i64 x = word[l], z = word[w + l], gx = gen[l], gz = gen[w + l];
        e += pop(gx & gz) + pop(x & z) - pop((x ^ gx) & (z ^ gz)) + 2 * pop(gz & x);
    }
    return ((e + 1) & 3) == 0 ? 1.0 : -1.0;
}

/* the bucket of a word: bit r is the parity of the word against hash row r */
static inline i64 bucket_of(const u32 *word, const u32 *hashes, i64 k, i64 w) {
    i64 b = 0;
    for (i64 r = 0; r < k; r++) {
        u32 par = 0;
        for (i64 l = 0; l < 2 * w; l++) par ^= word[l] & hashes[r * 2 * w + l];
        b |= (pop(par) & 1) << r;
    }
    return b;
}

/* k of 2^k buckets */
static inline i64 bits(i64 buckets) {
    i64 k = 0;
    while ((INT64_C(1) << k) < buckets) k++;
    return k;
}

/* The rule that drops a term: 0 weight, 1 coefficient, 2 sines (a term is charged to its first), -1 none
 * (truncation.violations). */
static inline int violates(double c, i64 weight_, i64 sins, i64 max_weight, double min_abs, i64 max_sins) {
    if (weight_ > max_weight) return 0;
    if (fabs(c) < min_abs) return 1;
    if (sins > max_sins) return 2;
    return -1;
}

/* hash of the canonical member of the pair of a word under G (XOR G when flip) */
static inline i64 hash(const u32 *word, const u32 *gen, int flip, i64 w2) {
    u64 h = UINT64_C(0x632BE59BD9B4E019);
    for (i64 l = 0; l < w2; l++) {
        u64 v = word[l];
        if (flip) v ^= gen[l];
        h = (h ^ v) * UINT64_C(0x9E3779B97F4A7C15);
        h ^= h >> 29;
    }
    return (i64)(h >> 1);
}

static inline int same_canonical(const u32 *wi, int fi, const u32 *wj, int fj, const u32 *gen, i64 w2) {
    for (i64 l = 0; l < w2; l++) {
        u32 a = wi[l], b = wj[l];
        if (fi) a ^= gen[l];
        if (fj) b ^= gen[l];
        if (a != b) return 0;
    }
    return 1;
}

/* mark slot i gone, listed at holes[at]; its 1-norm charged to `rule` */
static inline void drop(u8 *gone, i32 *holes, i64 at, i64 i, double *dropped, int rule, double abs_c) {
    gone[i] = 1;
    holes[at] = (i32)i;
    dropped[rule] += abs_c;
}

/* A word through a Clifford run: its image written in place. Returns whether its sign flipped; *dead: dropped by
 * the weight rule after a gate (weight_each; the word is then left midway). */
static inline int clifford_word(i64 dense, i64 start, i64 count, const i64 *cl_kind, const i64 *cl_qubits,
                                const i64 *cl_table, const i64 *cl_sign, const u32 *cl_gens, const i64 *cl_turns,
                                const u32 *map_tx, const u32 *map_tz, const i32 *map_te, u32 *word, i64 w, i64 *rx,
                                i64 *rz, const i64 *all_lanes, i64 weight_each, i64 max_weight, int *dead) {
    int negate = 0;
    *dead = 0;
    i64 wt = 0; /* the word's weight, followed gate by gate where weight_each (a gate changes its qubits' part) */
    if (dense) { /* the run's dense map: a lookup a non-zero byte of the word */
        i64 e = 0, cross = 0, y = 0;
        for (i64 l = 0; l < w; l++) {
            rx[l] = 0;
            rz[l] = 0;
            e += pop(word[l] & word[w + l]);
        }
        const size_t chunk = 256 * (size_t)w, map = 8 * (size_t)w * chunk;
        for (i64 lane = 0; lane < 2 * w; lane++) {
            u32 v = word[lane];
            for (i64 byte_at = 0; v != 0; byte_at++, v >>= 8) {
                u32 b = v & 0xFF;
                if (b == 0) continue;
                i64 c = 4 * lane + byte_at;
                const u32 *tx = map_tx + start * map + c * chunk + b * w, *tz = map_tz + start * map + c * chunk + b * w;
                for (i64 l = 0; l < w; l++) {
                    i64 ix = tx[l];
                    cross ^= rz[l] & ix;
                    rx[l] ^= ix;
                    rz[l] ^= tz[l];
                }
                e += map_te[(start * 8 * w + c) * 256 + b];
            }
        }
        for (i64 l = 0; l < w; l++) {
            y += pop(rx[l] & rz[l]);
            word[l] = (u32)rx[l];
            word[w + l] = (u32)rz[l];
        }
        return ((e + 2 * pop(cross) - y) & 3) != 0;
    }
    if (weight_each) wt = weight(word, w);
    for (i64 j = start; j < start + count; j++) {
        if (cl_kind[j] == TABLE) {
            i64 a = cl_qubits[2 * j], b = cl_qubits[2 * j + 1];
            i64 la = a / 32, sa = a % 32, lb = b / 32, sb = b % 32;
            i64 xa = (word[la] >> sa) & 1, za = (word[w + la] >> sa) & 1;
            i64 xb = (word[lb] >> sb) & 1, zb = (word[w + lb] >> sb) & 1;
            i64 code = xa | za << 1 | xb << 2 | zb << 3;
            if (code == 0) continue;
            i64 img = cl_table[16 * j + code];
            /* clear then set the bits of qubits a and b (for a one-qubit gate a == b: its diagonal code) */
            word[la] = (word[la] & ~(UINT32_C(1) << sa)) | (u32)((img & 1) << sa);
            word[w + la] = (word[w + la] & ~(UINT32_C(1) << sa)) | (u32)(((img >> 1) & 1) << sa);
            word[lb] = (word[lb] & ~(UINT32_C(1) << sb)) | (u32)(((img >> 2) & 1) << sb);
            word[w + lb] = (word[w + lb] & ~(UINT32_C(1) << sb)) | (u32)(((img >> 3) & 1) << sb);
            if (cl_sign[16 * j + code] < 0) negate = !negate;
            /* qubit b's bits are written last: for a one-qubit gate (a == b) they are qubit a's */
            i64 now_b = ((img >> 2) & 1) | ((img >> 3) & 1);
            wt += a == b ? now_b - (xa | za) : (((img & 1) | ((img >> 1) & 1)) + now_b - (xa | za) - (xb | zb));
        } else { /* a quarter turn of a generator on three or more qubits (rare: its lanes listed here) */
            i64 k = ((cl_turns[j] % 4) + 4) % 4;
            const u32 *gen = cl_gens + j * 2 * w;
            if (k == 0 || !anticommutes(word, gen, w, all_lanes, w)) continue;
            if (k == 2) {
                negate = !negate;
            } else {
                double s = product_sign(word, gen, w, all_lanes, w);
                if (k == 3) s = -s;
                for (i64 l = 0; l < 2 * w; l++) word[l] ^= gen[l];
                if (s < 0) negate = !negate;
                if (weight_each) wt = weight(word, w);
            }
        }
        if (weight_each && wt > max_weight) {
            *dead = 1;
            return negate;
        }
    }
    return negate;
}

/* The words of one bucket (slots base .. base + count - 1) that anticommute with gen (its lanes: gen_lanes), listed
 * from turning_[base]; returns their number. */
static inline i64 turning_bucket(const u32 *gen, const i64 *lanes, i64 nl, const u32 *words, i64 base, i64 count,
                                 i32 *turning_, i64 w) {
    i64 t = 0;
    for (i64 i = base; i < base + count; i++) { /* no branch: which words turn is as good as random */
        turning_[base + t] = (i32)i;
        t += anticommutes(words + i * 2 * w, gen, w, lanes, nl);
    }
    return t;
}

/* A rotation by G, first step, on part `part` of `parts` of the buckets (a contiguous range): each bucket's words
 * that anticommute with G listed in turning (per bucket), their number in turning_count. (A unit's later rotations
 * have theirs made by the rotation before them, bucket by bucket as its pairs finish: pairs()'s `next`.) */
EXPORT void turning(i64 g, i64 part, i64 parts, const u32 *gens, const u32 *words, const i64 *bucket_count,
                    i64 buckets, i64 slots, i32 *turning_, i64 *turning_count, i64 w) {
    i64 cap = slots / buckets;
    const u32 *gen = gens + g * 2 * w;
    i64 *lanes = (i64 *)malloc((size_t)w * sizeof(i64)), nl = gen_lanes(gen, w, lanes);
    for (i64 bucket = part * buckets / parts; bucket < (part + 1) * buckets / parts; bucket++)
        turning_count[bucket] = turning_bucket(gen, lanes, nl, words, bucket * cap, bucket_count[bucket], turning_, w);
    free(lanes);
}

/* 0 where every bucket has room for its words and every turning word of its partner bucket (P xor G lies in
 * bucket b xor bucket_of(G): the functionals are linear), else the most slots a bucket needs (a bound, known
 * before anything is written). */
EXPORT i64 need(i64 g, const u32 *gens, const i64 *bucket_count, i64 buckets, i64 slots, const i64 *turning_count,
                const u32 *hashes, i64 w) {
    i64 cap = slots / buckets, most = 0;
    i64 shift = bucket_of(gens + g * 2 * w, hashes, bits(buckets), w);
    for (i64 bucket = 0; bucket < buckets; bucket++) {
        i64 n = bucket_count[bucket] + turning_count[bucket ^ shift];
        if (n > cap && n > most) most = n;
    }
    return most;
}

/* A layout's passes over the live words (count_buckets, then rebucket) on threads: the source buckets in `parts`
 * ranges in order (part p: [p buckets / parts, (p + 1) buckets / parts)), each part counting its words of every new
 * bucket, so that rebucket places a part's words after the earlier parts' as one thread would. The parts: at most
 * the threads and the buckets, and few enough that their counts (parts << k) stay within PART_COUNTS. */
enum { PART_COUNTS = 1 << 22 };

EXPORT i64 layout_parts(i64 threads, i64 buckets, i64 k) {
    i64 parts = threads < buckets ? threads : buckets;
    while (parts > 1 && (parts << k) > PART_COUNTS) parts--;
    return parts < 1 ? 1 : parts;
}

/* counts[p << k | b] += part p's live words (in buckets of cap slots) that fall in bucket b of 2^k by the hashes,
 * each part on a thread of its own (parts: layout_parts's) */
EXPORT void count_buckets(i64 parts, const u32 *words, const i64 *bucket_count, i64 buckets, i64 cap,
                          const u32 *hashes, i64 k, i64 *counts, i64 w) {
#pragma omp parallel for schedule(static, 1) num_threads((int)parts) if (parts > 1)
    for (i64 p = 0; p < parts; p++) {
        i64 *mine = counts + (p << k);
        for (i64 bucket = p * buckets / parts; bucket < (p + 1) * buckets / parts; bucket++)
            for (i64 i = bucket * cap; i < bucket * cap + bucket_count[bucket]; i++)
                mine[bucket_of(words + i * 2 * w, hashes, k, w)]++;
    }
}

/* schedule.py's unit kinds (native.py checks that they agree) */
enum { U_MERGE, U_CLIFFORD, U_SPLIT, U_CHANNEL, U_TRUNCATE, U_NOOP, U_LAYER };
#define OFF (INT64_C(1) << 30) /* truncation.OFF: a weight or sine limit that never binds */

/* A lowered circuit's tables (native.Tables), laid out as native.py's ctypes Structure _CircuitTables: each
 * field 8 bytes, in this order. */
typedef struct {
    i64 units, lanes;
    const i64 *unit_kind, *unit_start, *unit_count;
    const u8 *unit_dense, *unit_defer;
    const i64 *cl_kind, *cl_qubits, *cl_table, *cl_sign;
    const u32 *cl_gens;
    const i64 *cl_turns;
    const u32 *map_tx, *map_tz;
    const i32 *map_te;
    const u32 *rot_gens;
    const i64 *ch_qubit;
    const double *ch_factor;
} circuit_tables;

/* A run's buffers (native.Workspace), laid out as native.py's ctypes Structure _Workspace. */
typedef struct {
    u32 *words;
    void *coeffs; /* the coefficient type's array */
    i32 *sins;
    u8 *gone;
    i32 *holes, *partner, *turning;
    i64 *table, *count, *turning_count;
    i64 buckets, slots, table_size;
} workspace;

/* The first k bucket functionals through Clifford unit u, so that its words stay in their buckets: a functional
 * f on the words before the run is f' = S M S f after it (S swaps the x and z halves; M^-1 = S M^T S for the
 * symplectic bit map M of the run), so bucket_of(M P) under f' is bucket_of(P) under f. Each row goes through the
 * run as a word would (no rule). hashes: (rows, 2W), updated in place. */
static void follow(const circuit_tables *t, i64 u, u32 *hashes, i64 k) {
    i64 w = t->lanes;
    if (k == 0) return;
    i64 *rx = (i64 *)malloc(3 * (size_t)w * sizeof(i64)), *rz = rx + w, *all_lanes = rx + 2 * w;
    u32 *row = (u32 *)malloc(2 * (size_t)w * sizeof(u32));
    for (i64 l = 0; l < w; l++) all_lanes[l] = l;
    for (i64 r = 0; r < k; r++) {
        u32 *f = hashes + r * 2 * w;
        int dead;
        for (i64 l = 0; l < w; l++) row[l] = f[w + l], row[w + l] = f[l];
        clifford_word(t->unit_dense[u], t->unit_start[u], t->unit_count[u], t->cl_kind, t->cl_qubits, t->cl_table,
                      t->cl_sign, t->cl_gens, t->cl_turns, t->map_tx, t->map_tz, t->map_te, row, w, rx, rz, all_lanes,
                      0, OFF, &dead);
        for (i64 l = 0; l < w; l++) f[l] = row[w + l], f[w + l] = row[l];
    }
    free(rx);
    free(row);
}

#define CT double
#define NAME(f) f##_f64
#include "_native_kernels.h"
#undef CT
#undef NAME

#define CT float
#define NAME(f) f##_f32
#include "_native_kernels.h"
#undef CT
#undef NAME

/* schedule.py's unit kinds as this library numbers them (native.py checks them at import) */
EXPORT void unit_kinds(i64 *out) {
    out[0] = U_MERGE, out[1] = U_CLIFFORD, out[2] = U_SPLIT, out[3] = U_CHANNEL, out[4] = U_TRUNCATE, out[5] = U_NOOP;
    out[6] = U_LAYER;
}

/* 1 where the library was built with OpenMP (rotations_threads runs on several threads), else 0 */
EXPORT i64 openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* A module too, so that the build is an ordinary extension and `import` finds its file (native.py then loads
 * that file with ctypes). */
static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "_native",
                                           "The native CPU engine's loops (loaded by native.py with ctypes).", -1,
                                           NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
