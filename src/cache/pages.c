/* Slab allocator of the CPU cache's pages: size classes, slabs of up to 64 pages with a free mask, O(1)
 * alloc and free, empty slabs released at once, compaction of sparse slabs (pages.h). */
#include "pages.h"

#include "common/common.h"

#include <stdlib.h>

struct kv_slab {
    uint64_t free_mask;   /* bit i: page i is free */
    kv_slab *prev, *next; /* the class's list of slabs with a free page */
    size_t bytes;         /* the allocation's size */
    uint32_t id;
    uint8_t n_pages;
    uint16_t cls;
    uint8_t on_list; /* on the class's partial list */
    uint8_t moving;  /* marked for emptying by a compaction */
};
static_assert(sizeof(kv_slab) <= E8KV_SLAB_HEADER, "the slab header fits before the first page");
static_assert(E8KV_SLAB_HEADER % E8KV_ALIGN == 0, "pages stay aligned");

static void *default_alloc(void *user, size_t n_bytes) {
    (void)user;
    return e8kv_malloc_aligned(n_bytes);
}

static void default_free(void *user, void *q) {
    (void)user;
    e8kv_free_aligned(q);
}

int e8kv_pages_init(kv_pages *p, size_t max_cls) {
    memset(p, 0, sizeof *p);
    p->sys_alloc = default_alloc;
    p->sys_free = default_free;
    p->max_cls = max_cls;
    return max_cls == 0 || max_cls > UINT16_MAX;
}

static uint64_t full_mask(size_t n) {
    return n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
}

static uint8_t *page_at(const kv_slab *s, size_t stride, size_t i) {
    return (uint8_t *)(uintptr_t)s + E8KV_SLAB_HEADER + i * stride;
}

static size_t n_free_in(const kv_slab *s) {
    return (size_t)__builtin_popcountll(s->free_mask);
}

static void push(kv_page_class *k, kv_slab *s) {
    assert(!s->on_list);
    s->prev = NULL;
    s->next = k->partial;
    if (k->partial) k->partial->prev = s;
    k->partial = s;
    s->on_list = 1;
}

static void unlink_slab(kv_page_class *k, kv_slab *s) {
    if (!s->on_list) return;
    if (s->prev)
        s->prev->next = s->next;
    else
        k->partial = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->on_list = 0;
}

static size_t table_bytes(const kv_pages *p) {
    if (!p->cls) return 0;
    return e8kv_aligned_size(p->max_cls * sizeof(kv_page_class)) +
           (p->cap
                ? e8kv_aligned_size(p->cap * sizeof(kv_slab *)) + e8kv_aligned_size(p->cap * sizeof(uint32_t))
                : 0);
}

size_t e8kv_pages_bytes(const kv_pages *p) {
    return p->slab_bytes + table_bytes(p);
}

size_t e8kv_pages_live_bytes(const kv_pages *p) {
    size_t n = 0;
    for (size_t i = 0; p->cls && i < p->n_cls; i++)
        n += p->cls[i].n_live * p->cls[i].page_bytes;
    return n;
}

/* The tables and the classes go when the last slab does: an empty cache holds nothing here. */
static void free_tables(kv_pages *p) {
    if (p->slab) p->sys_free(p->sys_user, p->slab);
    if (p->free_id) p->sys_free(p->sys_user, p->free_id);
    if (p->cls) p->sys_free(p->sys_user, p->cls);
    p->slab = NULL, p->free_id = NULL, p->cls = NULL;
    p->n_id = p->n_free_id = p->cap = p->n_cls = 0;
}

void e8kv_pages_release(kv_pages *p) {
    for (size_t i = 0; i < p->n_id; i++)
        if (p->slab[i]) p->sys_free(p->sys_user, p->slab[i]);
    free_tables(p);
    p->n_slab = p->slab_bytes = 0;
}

/* The class of pages of `stride` bytes, made on first use; -1 when every class is taken or out of
 * memory for the class table. */
static int class_of(kv_pages *p, size_t stride) {
    if (!p->cls) {
        p->cls = p->sys_alloc(p->sys_user, p->max_cls * sizeof *p->cls);
        if (!p->cls) return -1;
        p->n_cls = 0;
    }
    for (size_t i = 0; i < p->n_cls; i++)
        if (p->cls[i].page_bytes == stride) return (int)i;
    if (p->n_cls == p->max_cls) return -1;
    kv_page_class *k = &p->cls[p->n_cls];
    memset(k, 0, sizeof *k);
    k->page_bytes = stride;
    k->max_pages = E8KV_SLAB_TARGET_BYTES / stride;
    if (k->max_pages < 1) k->max_pages = 1;
    if (k->max_pages > E8KV_SLAB_MAX_PAGES) k->max_pages = E8KV_SLAB_MAX_PAGES;
    return (int)p->n_cls++;
}

/* Room for one more id in the tables; 0, or 1 when out of memory (the tables unchanged). */
static int reserve_id(kv_pages *p) {
    if (p->n_free_id || p->n_id < p->cap) return 0;
    const size_t cap = p->cap ? 2 * p->cap : 64;
    if (cap > (size_t)UINT32_MAX + 1) return 1;
    kv_slab **slab = p->sys_alloc(p->sys_user, cap * sizeof *slab);
    uint32_t *free_id = slab ? p->sys_alloc(p->sys_user, cap * sizeof *free_id) : NULL;
    if (!free_id) {
        if (slab) p->sys_free(p->sys_user, slab);
        return 1;
    }
    if (p->n_id) memcpy(slab, p->slab, p->n_id * sizeof *slab);
    /* the free-id stack is empty here */
    if (p->slab) p->sys_free(p->sys_user, p->slab);
    if (p->free_id) p->sys_free(p->sys_user, p->free_id);
    p->slab = slab, p->free_id = free_id, p->cap = cap;
    return 0;
}

static kv_slab *new_slab(kv_pages *p, size_t ci, size_t n_pages) {
    kv_page_class *k = &p->cls[ci];
    assert(n_pages >= 1 && n_pages <= k->max_pages);
    if (reserve_id(p)) return NULL;
    const size_t bytes = e8kv_aligned_size(E8KV_SLAB_HEADER + n_pages * k->page_bytes);
    kv_slab *s = p->sys_alloc(p->sys_user, bytes);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->free_mask = full_mask(n_pages);
    s->bytes = bytes;
    s->n_pages = (uint8_t)n_pages;
    s->cls = (uint16_t)ci;
    s->id = p->n_free_id ? p->free_id[--p->n_free_id] : (uint32_t)p->n_id++;
    p->slab[s->id] = s;
    p->slab_bytes += bytes;
    p->n_slab++;
    k->n_slabs++;
    k->n_cap += n_pages;
    push(k, s);
    return s;
}

static void release_slab(kv_pages *p, kv_slab *s) {
    kv_page_class *k = &p->cls[s->cls];
    unlink_slab(k, s);
    p->slab[s->id] = NULL;
    p->free_id[p->n_free_id++] = s->id;
    p->slab_bytes -= s->bytes;
    p->n_slab--;
    k->n_slabs--;
    k->n_cap -= s->n_pages;
    p->sys_free(p->sys_user, s);
    if (!p->n_slab) free_tables(p);
}

/* Take a free page from the class's first partial slab (there must be one). */
static uint8_t *take(kv_page_class *k, uint32_t *slab) {
    kv_slab *s = k->partial;
    assert(s && s->free_mask);
    const size_t i = (size_t)__builtin_ctzll(s->free_mask);
    s->free_mask &= ~((uint64_t)1 << i);
    if (!s->free_mask) unlink_slab(k, s);
    k->n_live++;
    *slab = s->id;
    return page_at(s, k->page_bytes, i);
}

/* The class of pages of n_bytes, or -1 (too large, or no class left). */
static int class_for(kv_pages *p, size_t n_bytes) {
    const size_t stride = e8kv_aligned_size(n_bytes ? n_bytes : 1);
    if (stride < n_bytes || stride > (SIZE_MAX - E8KV_SLAB_HEADER) / E8KV_SLAB_MAX_PAGES) return -1;
    return class_of(p, stride);
}

/* After a failure: no table outlives the last slab. */
static void drop_if_empty(kv_pages *p) {
    if (!p->n_slab) free_tables(p);
}

int e8kv_pages_reserve(kv_pages *p, size_t n_bytes, size_t n_pages) {
    const int ci = class_for(p, n_bytes);
    if (ci < 0) {
        drop_if_empty(p);
        return 1;
    }
    kv_page_class *k = &p->cls[ci];
    size_t made = 0;
    for (size_t avail = k->n_cap - k->n_live; avail < n_pages; made++) {
        const size_t m = n_pages - avail < k->max_pages ? n_pages - avail : k->max_pages;
        if (!new_slab(p, (size_t)ci, m)) {
            while (made--) /* the newest slabs head the partial list, all pages free */
                release_slab(p, k->partial);
            drop_if_empty(p);
            return 1;
        }
        avail += m;
    }
    return 0;
}

uint8_t *e8kv_pages_alloc(kv_pages *p, size_t n_bytes, uint32_t *slab) {
    const int ci = class_for(p, n_bytes);
    if (ci < 0) {
        drop_if_empty(p);
        return NULL;
    }
    kv_page_class *k = &p->cls[ci];
    const size_t stride = k->page_bytes;
    size_t grow = k->n_live / 64; /* no reservation: a slab of 1/64 of the class */
    grow = grow < 1 ? 1 : grow > k->max_pages ? k->max_pages : grow;
    if (!k->partial && !new_slab(p, (size_t)ci, grow)) {
        drop_if_empty(p);
        return NULL;
    }
    uint8_t *page = take(k, slab);
    memset(page, 0, stride);
    return page;
}

void e8kv_pages_free(kv_pages *p, uint8_t *page, uint32_t slab) {
    assert(slab < p->n_id && p->slab[slab]);
    kv_slab *s = p->slab[slab];
    kv_page_class *k = &p->cls[s->cls];
    const size_t off = (size_t)(page - page_at(s, k->page_bytes, 0)), i = off / k->page_bytes;
    assert(page >= page_at(s, k->page_bytes, 0) && off % k->page_bytes == 0 && i < s->n_pages);
    assert(!(s->free_mask >> i & 1));
    const int was_full = s->free_mask == 0;
    s->free_mask |= (uint64_t)1 << i;
    k->n_live--;
    if (s->free_mask == full_mask(s->n_pages))
        release_slab(p, s);
    else if (was_full && !s->moving)
        push(k, s);
}

/* ---------------------------------------------------------------- compaction */

/* Mark slab s of class k for emptying (tag 1: into the other slabs' room, 2: into new slabs). */
static void mark(kv_page_class *k, kv_slab *s, uint8_t tag) {
    s->moving = tag;
    unlink_slab(k, s);
}

/* Greedy: the slabs with the fewest live pages first, while the unmarked slabs' free pages take in what
 * the marked ones hold (emptying a slab moves its live pages and takes its free pages away). Whole
 * buckets of equal live counts below t, then slab by slab at t. Returns the free pages left in the
 * unmarked slabs; *n_marked and *cap_left (their pages) are updated. */
static size_t mark_greedy(kv_pages *p, size_t ci, size_t *n_marked, size_t *cap_left) {
    kv_page_class *k = &p->cls[ci];
    size_t room = k->n_cap - k->n_live, moved = 0;
    size_t live_b[E8KV_SLAB_MAX_PAGES + 1] = {0}, free_b[E8KV_SLAB_MAX_PAGES + 1] = {0};
    for (size_t i = 0; i < p->n_id; i++) {
        const kv_slab *s = p->slab[i];
        if (!s || s->cls != ci) continue;
        live_b[s->n_pages - n_free_in(s)] += s->n_pages - n_free_in(s);
        free_b[s->n_pages - n_free_in(s)] += n_free_in(s);
    }
    size_t t = 1;
    for (; t <= E8KV_SLAB_MAX_PAGES && moved + live_b[t] + free_b[t] <= room; t++)
        moved += live_b[t], room -= free_b[t];
    *cap_left = k->n_cap;
    for (size_t i = 0; i < p->n_id; i++) {
        kv_slab *s = p->slab[i];
        if (!s || s->cls != ci) continue;
        const size_t live = s->n_pages - n_free_in(s), fr = n_free_in(s);
        if (live > t) continue;
        if (live == t) {
            if (moved + live + fr > room) continue;
            moved += live, room -= fr;
        }
        mark(k, s, 1);
        *cap_left -= s->n_pages;
        (*n_marked)++;
    }
    return room - moved;
}

size_t e8kv_pages_compact_begin(kv_pages *p) {
    size_t n_marked = 0;
    for (size_t i = 0; i < p->n_id; i++) /* reserved and never used (a failed append) */
        if (p->slab[i] && n_free_in(p->slab[i]) == p->slab[i]->n_pages) release_slab(p, p->slab[i]);
    for (size_t ci = 0; ci < p->n_cls; ci++) {
        kv_page_class *k = &p->cls[ci];
        if (k->n_cap == k->n_live) continue;
        size_t cap_left = 0;
        const size_t waste = mark_greedy(p, ci, &n_marked, &cap_left);
        if (waste * E8KV_SLAB_WASTE_DIV <= cap_left) continue;
        /* still more than 1/E8KV_SLAB_WASTE_DIV free: every slab with a free page (and every one marked
         * above) is emptied into new slabs just large enough (when they can be had; else the greedy marks stand) */
        size_t n_move = 0, n_new = 0, made = 0;
        for (size_t i = 0; i < p->n_id; i++) {
            kv_slab *s = p->slab[i];
            if (!s || s->cls != ci || (!s->free_mask && !s->moving))
                continue; /* full: stays, unless marked */
            n_move += s->n_pages - n_free_in(s);
            n_new += !s->moving;
            if (!s->moving) mark(k, s, 2);
        }
        while (n_move) {
            const size_t m = n_move < k->max_pages ? n_move : k->max_pages;
            if (!new_slab(p, ci, m)) break;
            made++;
            n_move -= m;
        }
        if (!n_move) {
            n_marked += n_new;
            continue;
        }
        while (made--) /* out of memory: the new slabs go, the slabs of this pass go back in service */
            release_slab(p, k->partial);
        for (size_t i = 0; i < p->n_id; i++)
            if (p->slab[i] && p->slab[i]->moving == 2) {
                p->slab[i]->moving = 0;
                push(k, p->slab[i]);
            }
    }
    return n_marked;
}

int e8kv_pages_wasteful(const kv_pages *p) {
    for (size_t ci = 0; ci < p->n_cls; ci++) {
        const size_t waste = p->cls[ci].n_cap - p->cls[ci].n_live;
        if (waste >= p->cls[ci].max_pages && waste * E8KV_SLAB_WASTE_DIV > p->cls[ci].n_cap) return 1;
    }
    return 0;
}

int e8kv_pages_moving(const kv_pages *p, uint32_t slab) {
    assert(slab < p->n_id && p->slab[slab]);
    return p->slab[slab]->moving;
}

void e8kv_pages_move(kv_pages *p, uint8_t **page, uint32_t *slab) {
    kv_page_class *k = &p->cls[p->slab[*slab]->cls];
    uint32_t to = 0;
    uint8_t *dst = take(k, &to); /* the unmarked slabs have room for every moved page (compact_begin) */
    memcpy(dst, *page, k->page_bytes);
    e8kv_pages_free(p, *page, *slab);
    *page = dst;
    *slab = to;
}

void e8kv_pages_compact_end(kv_pages *p) {
    for (size_t i = 0; i < p->n_id; i++) {
        kv_slab *s = p->slab[i];
        if (!s || !s->moving) continue;
        s->moving = 0;
        if (s->free_mask) push(&p->cls[s->cls], s);
    }
}

void e8kv_pages_each_block(const kv_pages *p, void (*fn)(void *user, const void *block), void *user) {
    for (size_t i = 0; i < p->n_id; i++)
        if (p->slab[i]) fn(user, p->slab[i]);
    if (p->slab) fn(user, p->slab);
    if (p->free_id) fn(user, p->free_id);
    if (p->cls) fn(user, p->cls);
}
