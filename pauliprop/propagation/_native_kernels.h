/* The native engine's units for one coefficient type: included by _native.c once per type, with CT the
 * coefficient type and NAME(f) giving each function its type's suffix. See _native.c for the layout of the
 * buffers; native.py for what each unit does. */

/* Remove the h words listed in holes[base:base + h] (marked in gone) from the bucket's live words
 * [base, base + count): the staying words from m = base + count - h on fill the holes below m; clears their
 * gone flags. Returns the bucket's new count. */
static i64 NAME(fill_bucket)(u32 *words, CT *coeffs, i32 *sins, u8 *gone, const i32 *holes, i64 base, i64 count,
                             i64 h, i64 w2) {
    i64 m = base + count - h, src = m;
    for (i64 k = base; k < base + h; k++) {
        i64 d = holes[k];
        if (d >= m) continue;
        while (gone[src]) src++;
        memcpy(words + d * w2, words + src * w2, (size_t)w2 * sizeof(u32));
        coeffs[d] = coeffs[src];
        sins[d] = sins[src];
        src++;
    }
    for (i64 k = base; k < base + h; k++) gone[holes[k]] = 0;
    return count - h;
}

EXPORT void NAME(clifford_unit)(i64 threads, i64 dense, i64 start, i64 count, const i64 *cl_kind, const i64 *cl_qubits,
                                const i64 *cl_table, const i64 *cl_sign, const u32 *cl_gens, const i64 *cl_turns,
                                const u32 *map_tx, const u32 *map_tz, const i32 *map_te, u32 *words, CT *coeffs,
                                i32 *sins, u8 *gone, i32 *holes, i64 *bucket_count, i64 buckets, i64 slots, i64 w,
                                i64 weight_each, i64 end_weight, i64 max_weight, double *dropped) {
    i64 cap = slots / buckets;
    (void)threads;
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        double mine[3] = {0.0, 0.0, 0.0}; /* this thread's dropped norms */
        i64 *rx = (i64 *)malloc(3 * (size_t)w * sizeof(i64)), *rz = rx + w, *all_lanes = rx + 2 * w;
        for (i64 l = 0; l < w; l++) all_lanes[l] = l;
#pragma omp for schedule(dynamic, 8)
        for (i64 bucket = 0; bucket < buckets; bucket++) {
            i64 base = bucket * cap, h = 0;
            for (i64 i = base; i < base + bucket_count[bucket]; i++) {
                int dead = 0;
                int negate = clifford_word(dense, start, count, cl_kind, cl_qubits, cl_table, cl_sign, cl_gens,
                                           cl_turns, map_tx, map_tz, map_te, words + i * 2 * w, w, rx, rz,
                                           all_lanes, weight_each, max_weight, &dead);
                if (negate) coeffs[i] = -coeffs[i];
                if (dead || (end_weight && weight(words + i * 2 * w, w) > max_weight)) {
                    drop(gone, holes, base + h, i, mine, 0, fabs((double)coeffs[i]));
                    h++;
                }
            }
            if (h > 0) bucket_count[bucket] = NAME(fill_bucket)(words, coeffs, sins, gone, holes, base,
                                                                bucket_count[bucket], h, 2 * w);
        }
        free(rx);
#pragma omp critical
        for (int r = 0; r < 3; r++) dropped[r] += mine[r];
    }
}

EXPORT void NAME(rules_unit)(i64 threads, u32 *words, CT *coeffs, i32 *sins, u8 *gone, i32 *holes, i64 *bucket_count,
                             i64 buckets, i64 slots, i64 w, i64 max_weight, double min_abs, i64 max_sins,
                             double *dropped) {
    i64 cap = slots / buckets;
    (void)threads;
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        double mine[3] = {0.0, 0.0, 0.0};
#pragma omp for schedule(dynamic, 8)
        for (i64 bucket = 0; bucket < buckets; bucket++) {
            i64 base = bucket * cap, h = 0;
            for (i64 i = base; i < base + bucket_count[bucket]; i++) {
                int rule = violates((double)coeffs[i], weight(words + i * 2 * w, w), sins[i], max_weight, min_abs,
                                    max_sins);
                if (rule >= 0) {
                    drop(gone, holes, base + h, i, mine, rule, fabs((double)coeffs[i]));
                    h++;
                }
            }
            if (h > 0) bucket_count[bucket] = NAME(fill_bucket)(words, coeffs, sins, gone, holes, base,
                                                                bucket_count[bucket], h, 2 * w);
        }
#pragma omp critical
        for (int r = 0; r < 3; r++) dropped[r] += mine[r];
    }
}

EXPORT void NAME(channel_unit)(i64 threads, i64 start, i64 count, const i64 *ch_qubit, const double *ch_factor,
                               u32 *words, CT *coeffs, i32 *sins, u8 *gone, i32 *holes, i64 *bucket_count, i64 buckets,
                               i64 slots, i64 w, i64 max_weight, double min_abs, i64 max_sins, double *dropped) {
    i64 cap = slots / buckets;
    (void)threads;
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        double mine[3] = {0.0, 0.0, 0.0};
#pragma omp for schedule(dynamic, 8)
        for (i64 bucket = 0; bucket < buckets; bucket++) {
            i64 base = bucket * cap, h = 0;
            for (i64 i = base; i < base + bucket_count[bucket]; i++) {
                const u32 *word = words + i * 2 * w;
                double c = (double)coeffs[i];
                for (i64 j = start; j < start + count; j++) {
                    i64 q = ch_qubit[j];
                    i64 code = (((i64)word[q / 32] >> (q % 32)) & 1) | ((((i64)word[w + q / 32] >> (q % 32)) & 1) << 1);
                    c *= ch_factor[4 * j + code];
                }
                coeffs[i] = (CT)c;
                int rule = violates(c, weight(word, w), sins[i], max_weight, min_abs, max_sins);
                if (rule >= 0) {
                    drop(gone, holes, base + h, i, mine, rule, fabs(c));
                    h++;
                }
            }
            if (h > 0) bucket_count[bucket] = NAME(fill_bucket)(words, coeffs, sins, gone, holes, base,
                                                                bucket_count[bucket], h, 2 * w);
        }
#pragma omp critical
        for (int r = 0; r < 3; r++) dropped[r] += mine[r];
    }
}

/* A rotation by G, second step (after its turning lists are made and need() found room), on part `part` of
 * `parts` of the bucket pairs (a, a xor bucket_of(G)): P -> cos P + sin i G P for the turning words P, each
 * pair of buckets alone, its words in the cache. Parts touch disjoint buckets; each has its own table (4 cap
 * entries, -1: empty; left empty) and dropped. With next >= 0, the pair's buckets, once done, get rotation next's
 * turning lists in place of G's (turning(): every bucket is in one pair, and its words are still in the cache). */
EXPORT void NAME(pairs)(i64 g, CT cos_, CT sin_, i64 part, i64 parts, const u32 *gens, u32 *words, CT *coeffs,
                        i32 *sins, u8 *gone, i32 *holes, i32 *partner, i32 *turning, i64 *table,
                        i64 *bucket_count, i64 buckets, i64 slots, i64 *turning_count, const u32 *hashes,
                        i64 w, i64 max_weight, double min_abs, i64 max_sins, double *dropped, i64 next) {
    i64 cap = slots / buckets, w2 = 2 * w;
    const u32 *gen = gens + g * w2;
    i64 *lanes = (i64 *)malloc((size_t)w * sizeof(i64)), nl = gen_lanes(gen, w, lanes);
    const u32 *next_gen = gens + (next >= 0 ? next : g) * w2;
    i64 *next_lanes = (i64 *)malloc((size_t)w * sizeof(i64)), next_nl = gen_lanes(next_gen, w, next_lanes);
    i64 shift = bucket_of(gen, hashes, bits(buckets), w);
    i64 top = bits(shift + 1) - 1; /* the top set bit of shift: a pair's lower bucket has it clear */
    i64 pairs = shift ? buckets / 2 : buckets;
    /* the bit that tells a pair's two members apart: the lowest set bit of G */
    i64 flip_lane = 0, flip_bit = 0;
    for (i64 l = 0; l < w2; l++) {
        i64 v = gen[l];
        if (v != 0) {
            flip_lane = l;
            flip_bit = v & -v;
            break;
        }
    }
    for (i64 p = part * pairs / parts; p < (part + 1) * pairs / parts; p++) {
        i64 a = shift ? (((p >> top) << (top + 1)) | (p & ((INT64_C(1) << top) - 1))) : p; /* bit `top` of a: 0 */
        i64 b = a ^ shift;
        i64 ta = turning_count[a], tb = b != a ? turning_count[b] : 0, t = ta + tb;
        if (t == 0) {
            if (next >= 0) {
                turning_count[a] = turning_bucket(next_gen, next_lanes, next_nl, words, a * cap, bucket_count[a], turning, w);
                if (b != a)
                    turning_count[b] = turning_bucket(next_gen, next_lanes, next_nl, words, b * cap, bucket_count[b],
                                                      turning, w);
            }
            continue;
        }
        i64 size = 2;
        while (size < 2 * t) size <<= 1; /* a table of at least twice the turning words */
        i64 mask = size - 1, base_a = a * cap, base_b = b * cap, ha = 0, hb = 0;
        /* pair the turning words through the table; a pair mixes when its second member finds the first,
         * whose words are then in the cache: P -> cos P + sin s Q, Q -> cos Q - sin s P */
        for (i64 kk = 0; kk < t; kk++) {
            i64 i = kk < ta ? turning[base_a + kk] : turning[base_b + kk - ta];
            const u32 *wi = words + i * w2;
            int fi = ((i64)wi[flip_lane] & flip_bit) != 0;
            i64 hv = hash(wi, gen, fi, w2);
            i64 slot = hv & mask, tag = (hv >> 40) & 0x7FFFFF; /* 23 bits beside the slot: most mismatches read no word */
            partner[i] = -1;
            for (;;) {
                i64 entry = table[slot];
                if (entry < 0) {
                    table[slot] = (tag << 32) | i;
                    break;
                }
                if ((entry >> 32) == tag) {
                    i64 j = entry & 0xFFFFFFFF;
                    const u32 *wj = words + j * w2;
                    int fj = ((i64)wj[flip_lane] & flip_bit) != 0;
                    if (same_canonical(wi, fi, wj, fj, gen, w2)) {
                        partner[i] = (i32)j;
                        partner[j] = (i32)i;
                        double sign = product_sign(wj, gen, w, lanes, nl);
                        CT c = coeffs[j], cq = coeffs[i];
                        i64 s = sins[j], sq = sins[i];
                        double mine = cos_ * c - sin_ * sign * cq, theirs = cos_ * cq + sin_ * sign * c;
                        i64 my_sins = s < sq + 1 ? s : sq + 1, their_sins = sq < s + 1 ? sq : s + 1;
                        coeffs[j] = (CT)mine;
                        sins[j] = (i32)my_sins;
                        coeffs[i] = (CT)theirs;
                        sins[i] = (i32)their_sins;
                        int rule = violates(mine, weight(wj, w), my_sins, max_weight, min_abs, max_sins);
                        if (rule >= 0) {
                            if (j < base_b || a == b) drop(gone, holes, base_a + ha++, j, dropped, rule, fabs(mine));
                            else drop(gone, holes, base_b + hb++, j, dropped, rule, fabs(mine));
                        }
                        rule = violates(theirs, weight(wi, w), their_sins, max_weight, min_abs, max_sins);
                        if (rule >= 0) {
                            if (kk < ta) drop(gone, holes, base_a + ha++, i, dropped, rule, fabs(theirs));
                            else drop(gone, holes, base_b + hb++, i, dropped, rule, fabs(theirs));
                        }
                        break;
                    }
                }
                slot = (slot + 1) & mask;
            }
        }
        for (i64 kk = 0; kk < size; kk++) table[kk] = -1;
        /* the words left alone keep cos of their coefficients; their partners are appended to the other
         * bucket with sin s of them */
        i64 add_a = 0, add_b = 0;
        for (i64 kk = 0; kk < t; kk++) {
            int in_a = kk < ta;
            i64 i = in_a ? turning[base_a + kk] : turning[base_b + kk - ta];
            if (partner[i] >= 0) continue;
            const u32 *wi = words + i * w2;
            CT c = coeffs[i];
            i64 s = sins[i];
            double sign = product_sign(wi, gen, w, lanes, nl);
            double mine = cos_ * c, spawn = sin_ * sign * c;
            coeffs[i] = (CT)mine;
            int rule = violates(mine, weight(wi, w), s, max_weight, min_abs, max_sins);
            if (rule >= 0) {
                if (in_a) drop(gone, holes, base_a + ha++, i, dropped, rule, fabs(mine));
                else drop(gone, holes, base_b + hb++, i, dropped, rule, fabs(mine));
            }
            int into_b = in_a && a != b;
            i64 d = into_b ? base_b + bucket_count[b] + add_b : base_a + bucket_count[a] + add_a;
            u32 *wd = words + d * w2;
            for (i64 l = 0; l < w2; l++) wd[l] = wi[l] ^ gen[l];
            rule = violates(spawn, weight(wd, w), s + 1, max_weight, min_abs, max_sins);
            if (rule >= 0) {
                dropped[rule] += fabs(spawn);
            } else {
                coeffs[d] = (CT)spawn;
                sins[d] = (i32)(s + 1);
                if (into_b) add_b++;
                else add_a++;
            }
        }
        bucket_count[a] = NAME(fill_bucket)(words, coeffs, sins, gone, holes, base_a, bucket_count[a] + add_a, ha, w2);
        if (b != a)
            bucket_count[b] = NAME(fill_bucket)(words, coeffs, sins, gone, holes, base_b, bucket_count[b] + add_b, hb,
                                                w2);
        if (next >= 0) {
            turning_count[a] = turning_bucket(next_gen, next_lanes, next_nl, words, base_a, bucket_count[a], turning, w);
            if (b != a)
                turning_count[b] = turning_bucket(next_gen, next_lanes, next_nl, words, base_b, bucket_count[b], turning,
                                                  w);
        }
    }
    free(lanes);
    free(next_lanes);
}

/* The rotations first .. end - 1 of a unit, one after another, on one thread: exp(-i a/2 G) on every word (the
 * first one's turning lists by a scan, the others' made by the pairs of the rotation before).
 * out: (the rotation it stopped at (end: done), the slots a bucket needs there (0: done; nothing of that
 * rotation written), the most live words after any rotation (at least peak)). */
EXPORT void NAME(rotations)(i64 first, i64 end, const CT *rot_cos, const CT *rot_sin, const u32 *gens, u32 *words,
                            CT *coeffs, i32 *sins, u8 *gone, i32 *holes, i32 *partner, i32 *turning_, i64 *table,
                            i64 *bucket_count, i64 buckets, i64 slots, i64 *turning_count, const u32 *hashes, i64 w,
                            i64 max_weight, double min_abs, i64 max_sins, double *dropped, i64 peak, i64 *out) {
    for (i64 g = first; g < end; g++) {
        if (g == first) turning(g, 0, 1, gens, words, bucket_count, buckets, slots, turning_, turning_count, w);
        i64 need_ = need(g, gens, bucket_count, buckets, slots, turning_count, hashes, w);
        if (need_ > 0) {
            out[0] = g, out[1] = need_, out[2] = peak;
            return;
        }
        NAME(pairs)(g, rot_cos[g], rot_sin[g], 0, 1, gens, words, coeffs, sins, gone, holes, partner, turning_, table,
                    bucket_count, buckets, slots, turning_count, hashes, w, max_weight, min_abs, max_sins, dropped,
                    g + 1 < end ? g + 1 : -1);
        i64 n = 0;
        for (i64 b = 0; b < buckets; b++) n += bucket_count[b];
        if (n > peak) peak = n;
    }
    out[0] = end, out[1] = 0, out[2] = peak;
}

/* rotations() on up to `threads` threads (OpenMP; one where the library was built without it): the first
 * rotation's turning lists by ranges of buckets, then for each rotation, where every bucket has room, its bucket
 * pairs by ranges of pairs (which make the next rotation's turning lists: two barriers a rotation), the
 * ranges (RANGES_PER_THREAD a thread) handed out one at a time as threads come free, so a thread that is slowed
 * (preempted, or given the busier buckets) holds up one range, not a thread's share; each thread with its own
 * table (tables: threads rows of table_size entries, -1: empty) and dropped norms (drops: threads rows of 3). The same values and terms as on one thread (a pair's arithmetic does not depend on who
 * does it); the dropped norms are summed in another order. out as rotations()'s. */
EXPORT void NAME(rotations_threads)(i64 threads, i64 first, i64 end, const CT *rot_cos, const CT *rot_sin,
                                    const u32 *gens, u32 *words, CT *coeffs, i32 *sins, u8 *gone, i32 *holes,
                                    i32 *partner, i32 *turning_, i64 *tables, i64 table_size, i64 *bucket_count,
                                    i64 buckets, i64 slots, i64 *turning_count, const u32 *hashes, i64 w,
                                    i64 max_weight, double min_abs, i64 max_sins, double *drops, i64 peak, i64 *out) {
#ifdef _OPENMP
    i64 stop = end, stop_need = 0;
#pragma omp parallel num_threads((int)threads)
    {
        i64 part = omp_get_thread_num(), ranges = RANGES_PER_THREAD * omp_get_num_threads();
#pragma omp for schedule(dynamic, 1)
        for (i64 r = 0; r < ranges; r++)
            turning(first, r, ranges, gens, words, bucket_count, buckets, slots, turning_, turning_count, w);
        for (i64 g = first; g <= end; g++) {
#pragma omp single
            {
                i64 n = 0; /* the live words after rotation g - 1 */
                for (i64 b = 0; b < buckets; b++) n += bucket_count[b];
                if (n > peak) peak = n;
                n = g < end ? need(g, gens, bucket_count, buckets, slots, turning_count, hashes, w) : 0;
                if (n > 0) stop = g, stop_need = n;
            } /* (a barrier: every thread reads stop_need as written) */
            if (stop_need > 0 || g == end) break;
#pragma omp for schedule(dynamic, 1)
            for (i64 r = 0; r < ranges; r++)
                NAME(pairs)(g, rot_cos[g], rot_sin[g], r, ranges, gens, words, coeffs, sins, gone, holes, partner,
                            turning_, tables + part * table_size, bucket_count, buckets, slots, turning_count, hashes,
                            w, max_weight, min_abs, max_sins, drops + 3 * part, g + 1 < end ? g + 1 : -1);
        }
    }
    out[0] = stop, out[1] = stop_need, out[2] = peak;
#else
    (void)threads, (void)table_size;
    NAME(rotations)(first, end, rot_cos, rot_sin, gens, words, coeffs, sins, gone, holes, partner, turning_, tables,
                    bucket_count, buckets, slots, turning_count, hashes, w, max_weight, min_abs, max_sins, drops, peak,
                    out);
#endif
}

/* The units from `unit` (rotation `step` of it) on the live words of ws: the whole unit loop in one call (the
 * GIL released throughout). hashes: the bucket functionals (rows of 2W), which follow the words through the
 * Clifford units (the first log2(buckets) rows, updated in place). Limits: OFF / 0.0 / OFF where a rule is off.
 * Writes the live terms after each unit into unit_terms and adds the 1-norm each rule dropped into dropped. A
 * unit runs on `threads` threads from thread_min live words (a rotation on at most one thread a bucket pair).
 * out: (the next unit (units: done), the rotation of it to resume at, the slots a bucket of that rotation needs
 * (0: done; nothing of it written), the most live words after any unit or rotation, the most threads a unit ran
 * on). */
EXPORT void NAME(run)(const circuit_tables *t, workspace *ws, u32 *hashes, i64 unit, i64 step, const CT *cos_,
                      const CT *sin_, i64 max_weight, double min_abs, i64 max_sins, i64 per_layer, i64 weight_each,
                      i64 threads, i64 thread_min, i32 *unit_terms, double *dropped, i64 peak, i64 *out) {
    i64 w = t->lanes, n = 0, most_threads = 1;
    CT *coeffs = (CT *)ws->coeffs;
    i64 *tables = NULL;
    double *drops = NULL;
    if (threads > 1) { /* each thread's pair table (left empty after each pair) and dropped norms */
        tables = (i64 *)malloc((size_t)(threads * ws->table_size) * sizeof(i64));
        drops = (double *)calloc(3 * (size_t)threads, sizeof(double));
        for (i64 i = 0; i < threads * ws->table_size; i++) tables[i] = -1;
    }
    for (i64 b = 0; b < ws->buckets; b++) n += ws->count[b];
    out[1] = 0, out[2] = 0;
    for (i64 u = unit; u < t->units; u++) {
        i64 kind = t->unit_kind[u], start = t->unit_start[u], count = t->unit_count[u];
        i64 parts = n >= thread_min ? threads : 1;
        /* the rules this unit applies (tiled.end_rules; a rotation's own unless its step defers them) */
        i64 lw = max_weight, ls = max_sins;
        double lc = min_abs;
        if ((kind == U_SPLIT || kind == U_LAYER) && t->unit_defer[u]) lw = OFF, lc = 0.0, ls = OFF;
        else if (kind == U_CHANNEL && !per_layer) lw = OFF, ls = OFF;
        if (kind == U_CLIFFORD) {
            NAME(clifford_unit)(parts, t->unit_dense[u], start, count, t->cl_kind, t->cl_qubits, t->cl_table,
                                t->cl_sign, t->cl_gens, t->cl_turns, t->map_tx, t->map_tz, t->map_te, ws->words, coeffs,
                                ws->sins, ws->gone, ws->holes, ws->count, ws->buckets, ws->slots, w, weight_each,
                                !weight_each, max_weight, dropped);
            follow(t, u, hashes, bits(ws->buckets));
        } else if (kind == U_CHANNEL) {
            NAME(channel_unit)(parts, start, count, t->ch_qubit, t->ch_factor, ws->words, coeffs, ws->sins, ws->gone,
                               ws->holes, ws->count, ws->buckets, ws->slots, w, lw, lc, ls, dropped);
        } else if (kind == U_TRUNCATE) {
            NAME(rules_unit)(parts, ws->words, coeffs, ws->sins, ws->gone, ws->holes, ws->count, ws->buckets, ws->slots,
                             w, lw, lc, ls, dropped);
        } else if (kind == U_SPLIT || kind == U_LAYER) {
            i64 got[3];
            if (parts > ws->buckets / 2) parts = ws->buckets / 2; /* the pairs of buckets split among the threads */
            if (parts > 1)
                NAME(rotations_threads)(parts, start + step, start + count, cos_, sin_, t->rot_gens, ws->words, coeffs,
                                        ws->sins, ws->gone, ws->holes, ws->partner, ws->turning, tables,
                                        ws->table_size, ws->count, ws->buckets, ws->slots, ws->turning_count, hashes,
                                        w, lw, lc, ls, drops, peak, got);
            else
                NAME(rotations)(start + step, start + count, cos_, sin_, t->rot_gens, ws->words, coeffs, ws->sins,
                                ws->gone, ws->holes, ws->partner, ws->turning, ws->table, ws->count, ws->buckets,
                                ws->slots, ws->turning_count, hashes, w, lw, lc, ls, dropped, peak, got);
            peak = got[2];
            if (got[1] > 0) {
                out[0] = u, out[1] = got[0] - start, out[2] = got[1];
                unit = -1; /* stopped */
            }
            step = 0;
        }
        if (parts > most_threads) most_threads = parts;
        if (unit < 0) break;
        n = 0;
        for (i64 b = 0; b < ws->buckets; b++) n += ws->count[b];
        unit_terms[u] = (i32)n;
        if (n > peak) peak = n;
    }
    if (unit >= 0) out[0] = t->units;
    out[3] = peak, out[4] = most_threads;
    if (threads > 1) {
        for (i64 p = 0; p < threads; p++)
            for (int r = 0; r < 3; r++) dropped[r] += drops[3 * p + r];
        free(tables);
        free(drops);
    }
}

/* The live words into 2^k buckets of new_cap slots by the hashes (new_count: zeros, then their counts), in the
 * parts count_buckets counted (counts: its per-part counts, turned into each part's next slots here), each part on
 * a thread of its own and its words of a new bucket after the earlier parts', so every word lands where one
 * thread, bucket after bucket, puts it. */
EXPORT void NAME(rebucket)(i64 parts, i64 *counts, const u32 *words, const CT *coeffs, const i32 *sins,
                           const i64 *bucket_count, i64 buckets, i64 cap, u32 *new_words, CT *new_coeffs,
                           i32 *new_sins, i64 *new_count, i64 new_cap, const u32 *hashes, i64 k, i64 w) {
    for (i64 b = 0; b < (INT64_C(1) << k); b++) {
        i64 at = new_count[b];
        for (i64 p = 0; p < parts; p++) {
            i64 c = counts[(p << k) | b];
            counts[(p << k) | b] = at;
            at += c;
        }
        new_count[b] = at;
    }
#pragma omp parallel for schedule(static, 1) num_threads((int)parts) if (parts > 1)
    for (i64 p = 0; p < parts; p++) {
        i64 *next = counts + (p << k);
        for (i64 bucket = p * buckets / parts; bucket < (p + 1) * buckets / parts; bucket++)
            for (i64 i = bucket * cap; i < bucket * cap + bucket_count[bucket]; i++) {
                i64 b = bucket_of(words + i * 2 * w, hashes, k, w);
                i64 d = b * new_cap + next[b]++;
                memcpy(new_words + d * 2 * w, words + i * 2 * w, 2 * (size_t)w * sizeof(u32));
                new_coeffs[d] = coeffs[i];
                new_sins[d] = sins[i];
            }
    }
}

/* sum over the live words of coefficient * <state| P |state> (engine.overlap_table's factors: table (32 W, 4)). */
EXPORT double NAME(value)(const u32 *words, const CT *coeffs, const i64 *bucket_count, i64 buckets, i64 slots,
                          const double *table, i64 w) {
    i64 cap = slots / buckets;
    double total = 0.0;
    for (i64 bucket = 0; bucket < buckets; bucket++)
        for (i64 i = bucket * cap; i < bucket * cap + bucket_count[bucket]; i++) {
            const u32 *word = words + i * 2 * w;
            double ov = 1.0;
            for (i64 l = 0; l < w; l++) {
                i64 x = word[l], z = word[w + l], sites = x | z;
                while (sites != 0 && ov != 0.0) {
                    i64 low = sites & -sites;
                    i64 q = 32 * l + pop(low - 1);
                    i64 code = ((x & low) != 0 ? 1 : 0) | ((z & low) != 0 ? 2 : 0);
                    ov *= table[4 * q + code];
                    sites ^= low;
                }
            }
            total += coeffs[i] * ov;
        }
    return total;
}
