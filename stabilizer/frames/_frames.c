/* The stabilizer's CPU loops (stabilizer/frames/native.py loads this library with ctypes and drives it):
 * compiled once when the package is installed, so a sampler's first call compiles nothing.
 *
 * Both functions run the flat program of stabilizer/circuits/program.py (`flatten`), its rows packed by
 * native.py into
 *   prog  (ops, 8) int32: kind, active slots, gate number, advance, is_else, loop_level, loop_start, loop_count
 *   probs (ops, 15) float64: a NOISE op's 15 Pauli events (program.PAIRS order), else probs[0] the op's p
 *   slots (ops, width, 4) int32: q0, q1 (the spare qubit, `spare`, where a slot has one qubit), rec (MEASURE /
 *         MPAD: offset from the running record count, -1 none; FEEDBACK: the lookback), flags (bit 0 reset,
 *         1 px, 2 pz, 3 invert)
 * with the op kinds GATE, MEASURE, NOISE, CORRELATED, FEEDBACK, MPAD of program.py, and a loop row (an
 * identity GATE with loop_level >= 0) sending the runner back to loop_start while the level's count is short
 * of loop_count, as program.run_flat does.
 *
 *   frames_sample     Pauli frames of every shot, 64 shots a uint64 word, in chunks of `chunk_words` words
 *                     (one chunk's frames and record stay in the cache; chunks on OpenMP's threads where the
 *                     compiler has it), each op as frames.py's rule of its kind; the outputs (XORs of record
 *                     rows, flipped where `invert`) transposed 64 x 64 bits at a time into Stim's shot-major
 *                     layouts: bool bytes or packed little-endian bytes. Noise is Stim's geometric gap
 *                     sampling (a p = 1e-3 channel costs about p random draws a bit), densely above DENSE_MIN.
 *                     Randomness: xoshiro256** seeded by splitmix64 from (seed, call, chunk): the shots of a
 *                     seed do not depend on the thread count or the layout asked for.
 *   reference_record  the noiseless record (random outcomes taken as 0, Stim's reference sample) on the
 *                     inverse tableau T(P) = U^dagger P U (Stim's convention, as stabilizer/tableau/tableau.py):
 *                     rows T(X_q), T(Z_q) of packed x and z bits with signs; gates prepended as products of
 *                     their qubits' rows (Heisenberg images and signs of the gate catalogue), a random Z
 *                     measurement collapsed by a CX fan-out from its pivot (the exclusive prefix-XOR sign
 *                     rule of tableau._fan_out_jax), then H or H_YZ, then X to set the outcome 0.
 *
 * Neither function holds a Python object (ctypes calls them with the GIL released). */

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
typedef uint64_t u64;
typedef uint8_t u8;

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

enum { GATE = 0, MEASURE = 1, NOISE = 2, CORRELATED = 3, FEEDBACK = 4, MPAD = 5 }; /* program.py's op kinds */
enum { F_RESET = 1, F_PX = 2, F_PZ = 4, F_INVERT = 8 };                            /* a slot's flags */

/* The slot's Pauli (its F_PX / F_PZ flags) applied to the shots whose bits are set in `bits` (cw words): a correlated
 * error where it fires, a feedback gate where its record bit is 1. */
static inline void xor_pauli(u64 *x, u64 *z, const i32 *s, i64 cw, const u64 *bits) {
    u64 *xa = x + s[0] * cw, *za = z + s[0] * cw;
    if (s[3] & F_PX)
        for (i64 w = 0; w < cw; w++) xa[w] ^= bits[w];
    if (s[3] & F_PZ)
        for (i64 w = 0; w < cw; w++) za[w] ^= bits[w];
}
enum { PROG = 8, SLOT = 4, EVENTS = 15 };
#define DENSE_MIN 0.25 /* a total probability above it is drawn bit by bit (one uniform a bit) */

static inline int popcount64(u64 v) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_popcountll(v);
#else
    v = v - ((v >> 1) & 0x5555555555555555ULL);
    v = (v & 0x3333333333333333ULL) + ((v >> 2) & 0x3333333333333333ULL);
    return (int)((((v + (v >> 4)) & 0x0F0F0F0F0F0F0F0FULL) * 0x0101010101010101ULL) >> 56);
#endif
}

static inline int lowest_bit(u64 v) { /* v != 0 */
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(v);
#else
    return popcount64((v & (0 - v)) - 1);
#endif
}

/* ---- randomness: splitmix64 seeds xoshiro256** ------------------------------------------------------------ */

typedef struct { u64 s[4]; } rng_t;

static inline u64 splitmix64(u64 *x) {
    u64 z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, u64 seed0, u64 seed1, u64 stream) {
    u64 x = seed0;
    u64 a = splitmix64(&x);
    x = a ^ seed1;
    u64 b = splitmix64(&x);
    x = b ^ (stream * 0xD1B54A32D192ED03ULL);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline u64 rotl(u64 x, int k) { return (x << k) | (x >> (64 - k)); }

static inline u64 rng_next(rng_t *r) {
    u64 *s = r->s;
    u64 result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static inline double uniform_open0(rng_t *r) { return ((rng_next(r) >> 11) + 1) * (1.0 / 9007199254740992.0); } /* (0, 1] */
static inline double uniform(rng_t *r) { return (rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }              /* [0, 1) */

/* ---- noise: which bit positions an event hits ---------------------------------------------------------------- */

/* The codes x_a | z_a << 1 | x_b << 2 | z_b << 3 of the 15 two-qubit Pauli events, Stim's order IX IY IZ XI XX ...
 * (program.pair_codes). */
static u8 pair_code(int e) {
    static const u8 X[4] = {0, 1, 1, 0}, Z[4] = {0, 0, 1, 1}; /* I X Y Z */
    int a = (e + 1) >> 2, b = (e + 1) & 3;
    return (u8)(X[a] | Z[a] << 1 | X[b] << 2 | Z[b] << 3);
}

typedef struct {
    double total, log1mp, cum[EVENTS];
    int events, last; /* events: how many entries of cum are used; last: the last nonzero event */
} channel_t;

static void channel(channel_t *c, const double *p, int events) {
    double s = 0;
    c->events = events;
    c->last = 0;
    for (int e = 0; e < events; e++) {
        s += p[e];
        c->cum[e] = s;
        if (p[e] > 0) c->last = e;
    }
    c->total = s;
    c->log1mp = log1p(-(s < 1 ? s : 1));
}

/* The event of a hit: e with probability p[e] / total (u uniform in [0, 1)); rounding never picks a zero event
 * past the last nonzero one. */
static inline int pick_event(const channel_t *c, double u) {
    double x = u * c->total;
    int e = 0;
    while (e < c->last && x >= c->cum[e]) e++;
    return e;
}

/* The bit positions of [0, bits) that a channel's events hit, each position taking event e with probability p[e]
 * independently (at most one event): `next_hit` gives them in increasing order. */
typedef struct {
    const channel_t *c;
    rng_t *r;
    i64 bits, pos;
} hits_t;

static inline hits_t hits(const channel_t *c, rng_t *r, i64 bits) {
    hits_t h = {c, r, bits, -1};
    return h;
}

static inline int next_hit(hits_t *h, i64 *position, int *event) {
    const channel_t *c = h->c;
    if (!(c->total > 0)) return 0;
    if (c->total <= DENSE_MIN) { /* the gap to the next hit is Geometric(total) */
        double gap = floor(log(uniform_open0(h->r)) / c->log1mp);
        if (!(gap < (double)(h->bits - h->pos - 1))) {
            h->pos = h->bits;
            return 0;
        }
        h->pos += 1 + (i64)gap;
        *event = c->events > 1 ? pick_event(c, uniform(h->r)) : 0;
        *position = h->pos;
        return 1;
    }
    while (++h->pos < h->bits) { /* one uniform a position: event e where it falls in [cum[e - 1], cum[e]) */
        double u = uniform(h->r);
        if (!(u < c->total)) continue;
        int e = 0;
        while (e < c->last && u >= c->cum[e]) e++;
        *event = e;
        *position = h->pos;
        return 1;
    }
    return 0;
}

/* ---- 64 x 64 bit transpose ------------------------------------------------------------------------------------ */

/* a[r] bit c -> a[c] bit r (Hacker's Delight 7-3 on 64-bit rows, lowest bit first). */
static void transpose64(u64 *a) {
    static const u64 masks[6] = {0x00000000FFFFFFFFULL, 0x0000FFFF0000FFFFULL, 0x00FF00FF00FF00FFULL,
                                 0x0F0F0F0F0F0F0F0FULL, 0x3333333333333333ULL, 0x5555555555555555ULL};
    for (int level = 0, j = 32; j; level++, j >>= 1) {
        u64 m = masks[level];
        for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
            u64 t = ((a[k] >> j) ^ a[k | j]) & m;
            a[k] ^= t << j;
            a[k | j] ^= t;
        }
    }
}

/* ---- the frame program ------------------------------------------------------------------------------------------ */

typedef struct {
    /* program */
    i64 ops, width, qubits, records, depth, spare;
    const i32 *prog, *slots, *forward;
    const double *probs;
    /* outputs: up to two, each rows of record indices (CSR), flipped where invert */
    i64 num_outputs;
    const i64 *out_ptr[2];
    const i32 *out_idx[2];
    const u8 *out_invert[2];
    i64 out_rows[2];
    u8 *out_buf[2];
    i64 bit_packed, shots, chunk_words;
    u64 seed0, seed1;
} frames_args;

typedef struct {
    u64 *x, *z, *record, *chain, *fire, *tmp;
    i32 *loops;
} chunk_buffers;

/* A gate's forward action on a slot's frame bits as 4 x 4 masks: m[out][in] all ones where the image of
 * generator `in` (x_a, z_a, x_b, z_b) has bit `out`. */
static void gate_masks(const i32 *forward, int g, u64 m[4][4]) {
    for (int in = 0; in < 4; in++)
        for (int out = 0; out < 4; out++) m[out][in] = ((forward[16 * g + (1 << in)] >> out) & 1) ? ~0ULL : 0;
}

/* Op pc's flip noise on the records its n slots write (MEASURE's and MPAD's): each shot's record bit flips where
 * the op's one-event channel hits it. */
static void flip_records(const frames_args *a, i64 pc, const i32 *sl, int n, i64 base, u64 *record, rng_t *rng,
                         i64 cw) {
    const i64 cbits = 64 * cw;
    channel_t c;
    channel(&c, a->probs + EVENTS * pc, 1);
    hits_t h = hits(&c, rng, n * cbits);
    i64 position;
    int event;
    while (next_hit(&h, &position, &event)) {
        const i32 *s = sl + SLOT * (position / cbits);
        i64 bit = position % cbits;
        if (s[2] >= 0 && base + s[2] < a->records) record[(base + s[2]) * cw + bit / 64] ^= 1ULL << (bit % 64);
    }
}

static void run_chunk(const frames_args *a, chunk_buffers *b, rng_t *rng, i64 cw) {
    const i64 cbits = 64 * cw;
    u64 *x = b->x, *z = b->z, *record = b->record, *chain = b->chain, *fire = b->fire;
    for (i64 i = 0; i < a->qubits * cw; i++) x[i] = 0;
    for (i64 i = 0; i < a->qubits * cw; i++) z[i] = rng_next(rng); /* every qubit freshly reset: Z part random */
    memset(record, 0, sizeof(u64) * (size_t)(a->records * cw));
    memset(chain, 0, sizeof(u64) * (size_t)cw);
    for (i64 l = 0; l < (a->depth > 0 ? a->depth : 1); l++) b->loops[l] = 0;
    i64 base = 0, pc = 0;
    while (pc < a->ops) {
        const i32 *op = a->prog + PROG * pc;
        const i32 *sl = a->slots + SLOT * a->width * pc;
        const int n = op[1];
        switch (op[0]) {
        case GATE: {
            if (op[2] == 0) break; /* the identity (loop rows, padding) */
            u64 m[4][4];
            gate_masks(a->forward, op[2], m);
            for (int j = 0; j < n; j++) {
                const i32 *s = sl + SLOT * j;
                u64 *xa = x + s[0] * cw, *za = z + s[0] * cw;
                if (s[1] == a->spare) {
                    for (i64 w = 0; w < cw; w++) {
                        u64 xv = xa[w], zv = za[w];
                        xa[w] = (xv & m[0][0]) ^ (zv & m[0][1]);
                        za[w] = (xv & m[1][0]) ^ (zv & m[1][1]);
                    }
                } else {
                    u64 *xb = x + s[1] * cw, *zb = z + s[1] * cw;
                    for (i64 w = 0; w < cw; w++) {
                        u64 v0 = xa[w], v1 = za[w], v2 = xb[w], v3 = zb[w];
                        xa[w] = (v0 & m[0][0]) ^ (v1 & m[0][1]) ^ (v2 & m[0][2]) ^ (v3 & m[0][3]);
                        za[w] = (v0 & m[1][0]) ^ (v1 & m[1][1]) ^ (v2 & m[1][2]) ^ (v3 & m[1][3]);
                        xb[w] = (v0 & m[2][0]) ^ (v1 & m[2][1]) ^ (v2 & m[2][2]) ^ (v3 & m[2][3]);
                        zb[w] = (v0 & m[3][0]) ^ (v1 & m[3][1]) ^ (v2 & m[3][2]) ^ (v3 & m[3][3]);
                    }
                }
            }
            break;
        }
        case MEASURE: {
            /* the outcome flips where the frame has an X part (and where the flip noise hits); the frame's
             * Z part becomes random (with a reset, the X part is cleared) */
            const int recorded = op[3] > 0;
            for (int j = 0; j < n; j++) {
                const i32 *s = sl + SLOT * j;
                if (recorded && s[2] >= 0 && base + s[2] < a->records)
                    memcpy(record + (base + s[2]) * cw, x + s[0] * cw, sizeof(u64) * (size_t)cw);
            }
            if (recorded) flip_records(a, pc, sl, n, base, record, rng, cw);
            for (int j = 0; j < n; j++) {
                const i32 *s = sl + SLOT * j;
                u64 *xa = x + s[0] * cw, *za = z + s[0] * cw;
                if (s[3] & F_RESET) memset(xa, 0, sizeof(u64) * (size_t)cw);
                for (i64 w = 0; w < cw; w++) za[w] = rng_next(rng);
            }
            break;
        }
        case NOISE: {
            channel_t c;
            channel(&c, a->probs + EVENTS * pc, EVENTS);
            hits_t h = hits(&c, rng, n * cbits);
            i64 position;
            int event;
            while (next_hit(&h, &position, &event)) {
                const i32 *s = sl + SLOT * (position / cbits);
                i64 bit = position % cbits, w = bit / 64;
                u64 one = 1ULL << (bit % 64);
                u8 code = pair_code(event);
                if (code & 1) x[s[0] * cw + w] ^= one;
                if (code & 2) z[s[0] * cw + w] ^= one;
                if (code & 4) x[s[1] * cw + w] ^= one;
                if (code & 8) z[s[1] * cw + w] ^= one;
            }
            break;
        }
        case CORRELATED: {
            channel_t c;
            channel(&c, a->probs + EVENTS * pc, 1);
            memset(fire, 0, sizeof(u64) * (size_t)cw);
            hits_t h = hits(&c, rng, cbits);
            i64 position;
            int event;
            while (next_hit(&h, &position, &event)) fire[position / 64] |= 1ULL << (position % 64);
            for (i64 w = 0; w < cw; w++) {
                if (op[4]) { /* ELSE_CORRELATED_ERROR: only where the chain has not fired */
                    fire[w] &= ~chain[w];
                    chain[w] |= fire[w];
                } else {
                    chain[w] = fire[w];
                }
            }
            for (int j = 0; j < n; j++) xor_pauli(x, z, sl + SLOT * j, cw, fire);
            break;
        }
        case FEEDBACK: {
            for (int j = 0; j < n; j++) {
                const i32 *s = sl + SLOT * j;
                i64 row = base - s[2];
                if (row < 0 || row >= a->records) continue;
                xor_pauli(x, z, s, cw, record + row * cw);
            }
            break;
        }
        case MPAD: {
            if (op[3] > 0) flip_records(a, pc, sl, n, base, record, rng, cw);
            break;
        }
        default:
            break;
        }
        base += op[3];
        if (op[5] >= 0) {
            i32 *count = b->loops + op[5];
            if (*count + 1 < op[7]) {
                *count += 1;
                pc = op[6];
                continue;
            }
            *count = 0;
        }
        pc++;
    }
}

/* Output o's rows for the chunk's shots [first, first + 64 cw) (only those below `shots` written). */
static void write_output(const frames_args *a, int o, const u64 *record, u64 *tmp, i64 cw, i64 first) {
    const i64 rows = a->out_rows[o];
    const i64 stride = a->bit_packed ? (rows + 7) / 8 : rows;
    u8 *buf = a->out_buf[o];
    u64 block[64];
    for (i64 r0 = 0; r0 < rows; r0 += 64) {
        const int nb = (int)(rows - r0 < 64 ? rows - r0 : 64);
        for (int j = 0; j < nb; j++) { /* tmp[j] = XOR of the row's record rows */
            u64 *t = tmp + j * cw;
            u64 flip = a->out_invert[o] && a->out_invert[o][r0 + j] ? ~0ULL : 0;
            for (i64 w = 0; w < cw; w++) t[w] = flip;
            for (i64 k = a->out_ptr[o][r0 + j]; k < a->out_ptr[o][r0 + j + 1]; k++) {
                const u64 *m = record + (i64)a->out_idx[o][k] * cw;
                for (i64 w = 0; w < cw; w++) t[w] ^= m[w];
            }
        }
        for (i64 w = 0; w < cw; w++) {
            i64 s0 = first + 64 * w;
            if (s0 >= a->shots) break;
            for (int j = 0; j < 64; j++) block[j] = j < nb ? tmp[j * cw + w] : 0;
            transpose64(block); /* block[s]: bit j = row r0 + j of shot s0 + s */
            int count = (int)(a->shots - s0 < 64 ? a->shots - s0 : 64);
            if (a->bit_packed) {
                int nbytes = (nb + 7) / 8;
                for (int s = 0; s < count; s++) {
                    u8 *dst = buf + (s0 + s) * stride + r0 / 8;
                    for (int k = 0; k < nbytes; k++) dst[k] = (u8)(block[s] >> (8 * k));
                }
            } else {
                for (int s = 0; s < count; s++) {
                    u8 *dst = buf + (s0 + s) * stride + r0;
                    const u64 v = block[s];
                    for (int j = 0; j < nb; j++) dst[j] = (u8)((v >> j) & 1);
                }
            }
        }
    }
}

static int alloc_buffers(const frames_args *a, chunk_buffers *b, i64 cw) {
    i64 widest = 64;
    b->x = malloc(sizeof(u64) * (size_t)(a->qubits * cw));
    b->z = malloc(sizeof(u64) * (size_t)(a->qubits * cw));
    b->record = malloc(sizeof(u64) * (size_t)((a->records > 0 ? a->records : 1) * cw));
    b->chain = malloc(sizeof(u64) * (size_t)cw);
    b->fire = malloc(sizeof(u64) * (size_t)cw);
    b->tmp = malloc(sizeof(u64) * (size_t)(widest * cw));
    b->loops = malloc(sizeof(i32) * (size_t)(a->depth > 0 ? a->depth : 1));
    return b->x && b->z && b->record && b->chain && b->fire && b->tmp && b->loops;
}

static void free_buffers(chunk_buffers *b) {
    free(b->x);
    free(b->z);
    free(b->record);
    free(b->chain);
    free(b->fire);
    free(b->tmp);
    free(b->loops);
}

/* Sample `shots` shots of the flat program into the outputs (see the file's comment). Returns 0, or -1 where a
 * chunk's buffers could not be allocated. */
EXPORT i64 frames_sample(i64 ops, i64 width, i64 qubits, i64 records, i64 depth, i64 spare, const i32 *prog,
                         const double *probs, const i32 *slots, const i32 *forward, i64 num_outputs,
                         const i64 *ptr0, const i32 *idx0, const u8 *inv0, i64 rows0, u8 *buf0, const i64 *ptr1,
                         const i32 *idx1, const u8 *inv1, i64 rows1, u8 *buf1, i64 bit_packed, i64 shots,
                         i64 chunk_words, u64 seed0, u64 seed1, i64 threads) {
    frames_args a = {ops, width, qubits, records, depth, spare, prog, slots, forward, probs, num_outputs,
                     {ptr0, ptr1}, {idx0, idx1}, {inv0, inv1}, {rows0, rows1}, {buf0, buf1},
                     bit_packed, shots, chunk_words, seed0, seed1};
    const i64 cw = chunk_words, chunks = (shots + 64 * cw - 1) / (64 * cw);
    int failed = 0;
    if (chunks == 0) return 0;
    if (threads < 1) threads = 1;
    if (threads > chunks) threads = chunks;
#ifdef _OPENMP
#pragma omp parallel num_threads((int)threads) reduction(| : failed)
#endif
    {
        chunk_buffers b;
        const int ready = alloc_buffers(&a, &b, cw);
        if (!ready) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (i64 c = 0; c < chunks; c++) { /* every thread meets the loop; one without buffers runs nothing */
            if (!ready) {
                failed = 1;
                continue;
            }
            rng_t rng;
            rng_seed(&rng, seed0, seed1, (u64)c);
            run_chunk(&a, &b, &rng, cw);
            for (int o = 0; o < num_outputs; o++) write_output(&a, o, b.record, b.tmp, cw, c * 64 * cw);
        }
        free_buffers(&b);
    }
    return failed ? -1 : 0;
}

/* ---- the reference shot on the inverse tableau ------------------------------------------------------------------ */

typedef struct {
    i64 n, w; /* qubits, words a row */
    u64 *xs, *zs; /* (2n, w): rows T(X_q) (q < n), then T(Z_q) */
    u8 *signs;    /* (2n,) 1: the row's sign is -1 */
    u64 *scratch; /* 8 w words: a gate's new rows */
} tableau_t;

/* g with P1 P2 = i^g (P1 xor P2), summed over words, for Hermitian Pauli rows (tableau.product_phase) */
static i64 product_phase(const u64 *x1, const u64 *z1, const u64 *x2, const u64 *z2, i64 w) {
    i64 g = 0;
    for (i64 k = 0; k < w; k++) {
        u64 X1 = x1[k] & ~z1[k], Y1 = x1[k] & z1[k], Z1 = ~x1[k] & z1[k];
        u64 X2 = x2[k] & ~z2[k], Y2 = x2[k] & z2[k], Z2 = ~x2[k] & z2[k];
        g += popcount64((X1 & Y2) | (Y1 & Z2) | (Z1 & X2)) - popcount64((X1 & Z2) | (Y1 & X2) | (Z1 & Y2));
    }
    return g;
}

/* Prepend a gate on (a, b) (b < 0: a one-qubit gate): its Heisenberg images (image, sign: 16 entries, codes
 * x_a | z_a << 1 | x_b << 2 | z_b << 3) make each generator's new row the product of the old rows it names,
 * T'(P_code) = i^{#Y} T(X_a)^{x_a} T(Z_a)^{z_a} T(X_b)^{x_b} T(Z_b)^{z_b}, with the image's sign. */
static int prepend_gate(tableau_t *t, const i32 *image, const i32 *sign, i64 a, i64 b) {
    const i64 n = t->n, w = t->w, gens = b < 0 ? 2 : 4;
    const i64 rows[4] = {a, n + a, b, n + b};
    u8 new_signs[4];
    for (i64 g = 0; g < gens; g++) {
        int code = image[1 << g];
        u64 *x = t->scratch + 2 * g * w, *z = x + w;
        memset(x, 0, sizeof(u64) * (size_t)(2 * w));
        i64 phase = 0;
        for (i64 f = 0; f < gens; f++) {
            if (!((code >> f) & 1)) continue;
            const u64 *fx = t->xs + rows[f] * w, *fz = t->zs + rows[f] * w;
            phase += product_phase(x, z, fx, fz, w) + 2 * t->signs[rows[f]];
            for (i64 k = 0; k < w; k++) {
                x[k] ^= fx[k];
                z[k] ^= fz[k];
            }
        }
        for (i64 q = 0; q < gens / 2; q++) phase += (code >> (2 * q)) & (code >> (2 * q + 1)) & 1; /* Y = i X Z */
        if (sign[1 << g] < 0) phase += 2;
        phase = ((phase % 4) + 4) % 4;
        if (phase & 1) return -1; /* not a Hermitian row: the tables are wrong */
        new_signs[g] = (u8)(phase == 2);
    }
    for (i64 g = 0; g < gens; g++) {
        memcpy(t->xs + rows[g] * w, t->scratch + 2 * g * w, sizeof(u64) * (size_t)w);
        memcpy(t->zs + rows[g] * w, t->scratch + (2 * g + 1) * w, sizeof(u64) * (size_t)w);
        t->signs[rows[g]] = new_signs[g];
    }
    return 0;
}

static inline int get_bit(const u64 *row, i64 q) { return (int)((row[q / 64] >> (q % 64)) & 1); }
static inline void flip_bit(u64 *row, i64 q) { row[q / 64] ^= 1ULL << (q % 64); }

/* Measure Z_q; a random outcome is taken as 0 (collapsed as tableau._collapse_row). Returns the outcome. */
static int measure_z(tableau_t *t, i64 q) {
    const i64 n = t->n, w = t->w, r = n + q;
    u64 *row = t->xs + r * w;
    i64 wp = -1;
    for (i64 k = 0; k < w; k++)
        if (row[k]) {
            wp = k;
            break;
        }
    if (wp < 0) return t->signs[r]; /* T(Z_q) has no x bits: determined, its sign */
    const i64 pivot = 64 * wp + lowest_bit(row[wp]);
    u64 *kmask = t->scratch; /* CX(pivot, k) for every other k with an x bit in T(Z_q), appended to every row */
    memcpy(kmask, row, sizeof(u64) * (size_t)w);
    flip_bit(kmask, pivot);
    const i64 pw = pivot / 64, ps = pivot % 64;
    for (i64 i = 0; i < 2 * n; i++) {
        u64 *x = t->xs + i * w, *z = t->zs + i * w;
        const u64 xp = (x[pw] >> ps) & 1, zp = (z[pw] >> ps) & 1;
        u64 carry = zp ? ~0ULL : 0; /* the pivot's z before each CX: zp xor the z bits of earlier targets */
        int flips = 0, zpar = 0;
        for (i64 k = 0; k < w; k++) {
            u64 zk = z[k] & kmask[k];
            if (!zk) continue;
            u64 inc = zk;
            inc ^= inc << 1;
            inc ^= inc << 2;
            inc ^= inc << 4;
            inc ^= inc << 8;
            inc ^= inc << 16;
            inc ^= inc << 32;
            u64 before = (inc ^ zk) ^ carry;
            flips ^= popcount64(zk & ~(x[k] ^ before)) & 1;
            int parity = popcount64(zk) & 1;
            zpar ^= parity;
            if (parity) carry = ~carry;
        }
        if (xp) {
            for (i64 k = 0; k < w; k++) x[k] ^= kmask[k];
            t->signs[i] ^= (u8)flips;
        }
        if (zpar) z[pw] ^= 1ULL << ps;
    }
    /* T(Z_q) now has one x bit, at the pivot: H_YZ (a Y there) or H (an X) appended on the pivot's column */
    const int use_yz = get_bit(t->zs + r * w, pivot);
    for (i64 i = 0; i < 2 * n; i++) {
        u64 *x = t->xs + i * w, *z = t->zs + i * w;
        int xb = (int)((x[pw] >> ps) & 1), zb = (int)((z[pw] >> ps) & 1);
        if (use_yz) { /* H_YZ: X -> -X, Y -> Z, Z -> Y: the x bit of X stays, Y <-> Z swap x */
            if (xb && !zb) t->signs[i] ^= 1;
            if (zb) x[pw] ^= 1ULL << ps;
        } else { /* H: X <-> Z, Y -> -Y */
            if (xb && zb) t->signs[i] ^= 1;
            if (xb != zb) {
                x[pw] ^= 1ULL << ps;
                z[pw] ^= 1ULL << ps;
            }
        }
    }
    if (t->signs[r]) /* X at the start of time flips every row with a Z or Y at the pivot: outcome 0 */
        for (i64 i = 0; i < 2 * n; i++) t->signs[i] ^= (u8)get_bit(t->zs + i * w, pivot);
    return 0;
}

/* ---- many random measurements: the tableau transposed -------------------------------------------------------- *
 * A collapse appends a CX fan-out, H or H_YZ and X on the pivot's column: row-major, every row's words pass through
 * a prefix-XOR (2n rows x w words); transposed (column q: its bit in each of the 2n rows, `rw` words) each CX is
 * three word operations on two columns (Stim's TableauTransposedRaii). A MEASURE op that meets a random outcome
 * with TRANSPOSE_MIN or more of its slots left measures them on the transposed tableau (one transpose there and
 * back). */
#define TRANSPOSE_MIN 8

typedef struct {
    i64 n, rw;
    u64 *xs, *zs, *signs; /* (n, rw) columns; signs: (rw,) one bit a row */
} columns_t;

/* rows (2n, w) -> columns (n, rw), or back (to_rows), 64 x 64 bits at a time */
static void transpose_tableau(tableau_t *t, columns_t *c, int to_rows) {
    const i64 n = t->n, w = t->w, rows = 2 * n;
    u64 block[64];
    for (int plane = 0; plane < 2; plane++) {
        u64 *r = plane ? t->zs : t->xs, *col = plane ? c->zs : c->xs;
        for (i64 rb = 0; rb < c->rw; rb++)
            for (i64 qb = 0; qb < w; qb++) {
                if (!to_rows) {
                    for (int i = 0; i < 64; i++) block[i] = rb * 64 + i < rows ? r[(rb * 64 + i) * w + qb] : 0;
                    transpose64(block);
                    for (int i = 0; i < 64 && qb * 64 + i < n; i++) col[(qb * 64 + i) * c->rw + rb] = block[i];
                } else {
                    for (int i = 0; i < 64; i++) block[i] = qb * 64 + i < n ? col[(qb * 64 + i) * c->rw + rb] : 0;
                    transpose64(block);
                    for (int i = 0; i < 64 && rb * 64 + i < rows; i++) r[(rb * 64 + i) * w + qb] = block[i];
                }
            }
    }
    if (!to_rows) {
        memset(c->signs, 0, sizeof(u64) * (size_t)c->rw);
        for (i64 i = 0; i < rows; i++) c->signs[i / 64] |= (u64)t->signs[i] << (i % 64);
    } else {
        for (i64 i = 0; i < rows; i++) t->signs[i] = (u8)((c->signs[i / 64] >> (i % 64)) & 1);
    }
}

/* measure_z on the transposed tableau (the same rule, the same pivot and outcome) */
static int measure_z_columns(columns_t *c, i64 q) {
    const i64 n = c->n, rw = c->rw, r = n + q, rword = r / 64;
    const u64 rbit = 1ULL << (r % 64);
    i64 pivot = -1;
    for (i64 j = 0; j < n; j++)
        if (c->xs[j * rw + rword] & rbit) {
            pivot = j;
            break;
        }
    if (pivot < 0) return (int)((c->signs[rword] >> (r % 64)) & 1);
    u64 *xp = c->xs + pivot * rw, *zp = c->zs + pivot * rw, *sg = c->signs;
    for (i64 k = pivot + 1; k < n; k++) { /* CX(pivot, k) appended, in order (each row's sign as the CNOT rule) */
        u64 *xk = c->xs + k * rw, *zk = c->zs + k * rw;
        if (!(xk[rword] & rbit)) continue;
        for (i64 i = 0; i < rw; i++) {
            sg[i] ^= xp[i] & zk[i] & ~(xk[i] ^ zp[i]);
            xk[i] ^= xp[i];
            zp[i] ^= zk[i];
        }
    }
    if (zp[rword] & rbit) { /* H_YZ: X -> -X, Y <-> Z */
        for (i64 i = 0; i < rw; i++) {
            sg[i] ^= xp[i] & ~zp[i];
            xp[i] ^= zp[i];
        }
    } else { /* H: X <-> Z, Y -> -Y */
        for (i64 i = 0; i < rw; i++) {
            u64 x = xp[i];
            sg[i] ^= x & zp[i];
            xp[i] = zp[i];
            zp[i] = x;
        }
    }
    if (sg[rword] & rbit) /* X at the start of time: outcome 0 */
        for (i64 i = 0; i < rw; i++) sg[i] ^= zp[i];
    return 0;
}

static inline int is_random(const tableau_t *t, i64 q) {
    const u64 *row = t->xs + (t->n + q) * t->w;
    for (i64 k = 0; k < t->w; k++)
        if (row[k]) return 1;
    return 0;
}

/* The noiseless record of the flat program (see the file's comment) into record (records bytes, 0 or 1).
 * image, sign: (gates, 16) Heisenberg images and signs of the gate catalogue. Returns 0, -1 where the tableau
 * could not be allocated, -2 where a gate's tables gave a non-Hermitian row. */
EXPORT i64 reference_record(i64 ops, i64 width, i64 num_qubits, i64 records, i64 depth, i64 spare, const i32 *prog,
                            const i32 *slots, const i32 *image, const i32 *sign, u8 *record) {
    tableau_t t;
    const i64 n = num_qubits, w = (n + 63) / 64 > 0 ? (n + 63) / 64 : 1;
    t.n = n;
    t.w = w;
    t.xs = calloc((size_t)(2 * n * w + 1), sizeof(u64));
    t.zs = calloc((size_t)(2 * n * w + 1), sizeof(u64));
    t.signs = calloc((size_t)(2 * n + 1), 1);
    t.scratch = malloc(sizeof(u64) * (size_t)(8 * w));
    i32 *loops = calloc((size_t)(depth > 0 ? depth : 1), sizeof(i32));
    columns_t cols = {0, 0, NULL, NULL, NULL}; /* allocated when a MEASURE op first needs them */
    u8 *random0 = malloc((size_t)(width > 0 ? width : 1)); /* a MEASURE op's slots: random when it starts */
    i64 status = 0;
    if (!t.xs || !t.zs || !t.signs || !t.scratch || !loops || !random0) {
        status = -1;
        goto done;
    }
    for (i64 q = 0; q < n; q++) {
        flip_bit(t.xs + q * w, q);
        flip_bit(t.zs + (n + q) * w, q);
    }
    memset(record, 0, (size_t)records);
    i64 base = 0, pc = 0;
    while (pc < ops) {
        const i32 *op = prog + PROG * pc;
        const i32 *sl = slots + SLOT * width * pc;
        const int k = op[1];
        switch (op[0]) {
        case GATE:
            if (op[2] == 0) break;
            for (int j = 0; j < k; j++) {
                const i32 *s = sl + SLOT * j;
                if (prepend_gate(&t, image + 16 * op[2], sign + 16 * op[2], s[0], s[1] == spare ? -1 : s[1])) {
                    status = -2;
                    goto done;
                }
            }
            break;
        case MEASURE: {
            /* a measurement determined when the op starts stays determined through the op's collapses (its
             * Z_q commutes with every measured Z, and a reset's X changes no determinism): only the others
             * can need a collapse, and only they count towards transposing */
            int transposed = 0, left = 0;
            for (int j = 0; j < k; j++) left += random0[j] = (u8)is_random(&t, sl[SLOT * j]);
            for (int j = 0; j < k; j++) {
                const i32 *s = sl + SLOT * j;
                if (!transposed && random0[j] && left >= TRANSPOSE_MIN) {
                    if (!cols.xs) {
                        cols.n = n;
                        cols.rw = (2 * n + 63) / 64;
                        cols.xs = malloc(sizeof(u64) * (size_t)(n * cols.rw));
                        cols.zs = malloc(sizeof(u64) * (size_t)(n * cols.rw));
                        cols.signs = malloc(sizeof(u64) * (size_t)cols.rw);
                        if (!cols.xs || !cols.zs || !cols.signs) {
                            status = -1;
                            goto done;
                        }
                    }
                    transpose_tableau(&t, &cols, 0);
                    transposed = 1;
                }
                const i64 r = n + s[0];
                int outcome = !transposed ? measure_z(&t, s[0])
                              : random0[j] ? measure_z_columns(&cols, s[0])
                                           : (int)((cols.signs[r / 64] >> (r % 64)) & 1);
                left -= random0[j];
                if (op[3] > 0 && s[2] >= 0 && base + s[2] < records)
                    record[base + s[2]] = (u8)(outcome ^ ((s[3] & F_INVERT) ? 1 : 0));
                if ((s[3] & F_RESET) && outcome) { /* X: negates T(Z_q) */
                    if (transposed)
                        cols.signs[(n + s[0]) / 64] ^= 1ULL << ((n + s[0]) % 64);
                    else
                        t.signs[n + s[0]] ^= 1;
                }
            }
            if (transposed) transpose_tableau(&t, &cols, 1);
            break;
        }
        case FEEDBACK:
            for (int j = 0; j < k; j++) {
                const i32 *s = sl + SLOT * j;
                i64 row = base - s[2];
                if (row < 0 || row >= records || !record[row]) continue;
                if (s[3] & F_PX) t.signs[n + s[0]] ^= 1; /* X negates T(Z_q), Z negates T(X_q) */
                if (s[3] & F_PZ) t.signs[s[0]] ^= 1;
            }
            break;
        case MPAD:
            for (int j = 0; j < k; j++) {
                const i32 *s = sl + SLOT * j;
                if (op[3] > 0 && s[2] >= 0 && base + s[2] < records) record[base + s[2]] = (u8)((s[3] & F_INVERT) ? 1 : 0);
            }
            break;
        default: /* NOISE, CORRELATED: noiseless */
            break;
        }
        base += op[3];
        if (op[5] >= 0) {
            i32 *count = loops + op[5];
            if (*count + 1 < op[7]) {
                *count += 1;
                pc = op[6];
                continue;
            }
            *count = 0;
        }
        pc++;
    }
done:
    free(random0);
    free(cols.xs);
    free(cols.zs);
    free(cols.signs);
    free(t.xs);
    free(t.zs);
    free(t.signs);
    free(t.scratch);
    free(loops);
    return status;
}

/* 1 where the library was built with OpenMP (chunks of shots on several threads), else 0 */
EXPORT i64 openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* A module too, so that the build is an ordinary extension and `import` finds its file (native.py then loads that
 * file with ctypes). */
static struct PyModuleDef frames_module = {PyModuleDef_HEAD_INIT, "_frames",
                                           "The stabilizer's CPU loops (loaded by native.py with ctypes).", -1,
                                           NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&frames_module); }
