/* Slab allocator of the CPU cache's pages (pages.c).
 *
 * Pages of one byte size (a size class: the coded pages of one codec, or the raw f32 pages) are carved
 * from slabs of up to E8KV_SLAB_MAX_PAGES pages, one 64-byte-aligned allocation each: a 64-byte header,
 * then the pages back to back, each E8KV_ALIGN-aligned. A slab is as large as the call that needs it asks
 * (e8kv_pages_reserve: an append reserves the pages it is about to fill), up to the bytes below, so a
 * prefill leaves no unused tail and a decode step that opens a page in every head takes one slab for
 * all of them; without a reservation a slab grows with its class (1/64 of its live pages). A page remembers
 * its slab's id (kv_page.slab), so freeing is O(1); a slab whose pages are all free goes back to the system
 * at once. e8kv_pages_bytes() is every slab's whole size (its free pages included) plus the allocator's
 * tables: what it holds, up to malloc's own header of each slab, where one allocation per page cost malloc's
 * header and alignment fragments for every page (55-84 B per 6,528-B page measured, BENCHMARKS.md "Bytes
 * held").
 *
 * Frees leave holes in slabs that stay live; e8kv_pages_compact_begin marks, per class, the sparsest
 * slabs whose pages fit in the free pages of the others (and, when more than 1/E8KV_SLAB_WASTE_DIV would
 * still be free, every slab with a hole, to be emptied into new slabs of the right size), the owner moves
 * every page of a marked slab (e8kv_pages_move) and the emptied slabs are released, so truncation and
 * eviction return memory. "Released" means handed back to malloc (free), which may keep it for the
 * process's next allocations rather than unmap it.
 *
 * Not locked: a cache's pages are allocated and freed only by calls that modify the cache, which the API
 * forbids on one cache from two threads at once (include/e8kv.h); the attention pool only reads pages. */
#ifndef E8KV_PAGES_H
#define E8KV_PAGES_H

#include <stddef.h>
#include <stdint.h>

/* Slabs hold at most this many pages (a 64-bit free mask) and stop growing past the bytes below, which
 * keeps them under glibc's default mmap threshold (128 KiB), where a chunk costs its 16-byte header and
 * not a rounding up to whole 4 KiB pages; a larger page gets a slab of its own. */
#define E8KV_SLAB_MAX_PAGES 64
#define E8KV_SLAB_TARGET_BYTES ((size_t)120 * 1024)
#define E8KV_SLAB_HEADER 64
#define E8KV_SLAB_WASTE_DIV 32

typedef struct kv_slab kv_slab;

typedef struct {
    size_t page_bytes; /* stride of a page in its slab (a multiple of E8KV_ALIGN) */
    size_t max_pages;  /* most pages of one slab */
    size_t n_live;     /* pages handed out */
    size_t n_cap;      /* pages of the live slabs */
    size_t n_slabs;
    kv_slab *partial; /* the slabs with a free page (and not being emptied), doubly linked */
} kv_page_class;

typedef struct {
    kv_page_class *cls; /* (max_cls): one class per page size met so far; NULL while no slab is live */
    size_t n_cls, max_cls;
    kv_slab **slab;    /* (cap) by id: a live slab, or NULL for an id free for reuse */
    uint32_t *free_id; /* (cap) a stack of the free ids below n_id */
    size_t n_free_id, n_id, cap;
    size_t slab_bytes; /* the slabs' allocation sizes, summed */
    size_t n_slab;     /* live slabs */
    /* where slabs and tables come from: e8kv_malloc_aligned / e8kv_free_aligned unless a test (the
     * out-of-memory tests of tests/test_pages.c) puts its own; both see the sizes they are asked */
    void *(*sys_alloc)(void *user, size_t n_bytes);
    void (*sys_free)(void *user, void *p);
    void *sys_user;
} kv_pages;

/* An allocator of at most max_cls page sizes (a cache: its codecs' coded pages and the raw ones); 0, or 1
 * when max_cls is 0 or above 65535. Nothing is allocated before the first page. */
int e8kv_pages_init(kv_pages *p, size_t max_cls);
/* Release every slab, the tables and the class table (whatever pages are still out). */
void e8kv_pages_release(kv_pages *p);
/* A zeroed page of n_bytes (rounded up to E8KV_ALIGN) and its slab's id in *slab; NULL when out of memory
 * (nothing changed) or when a new size class is needed and all max_cls are taken. */
uint8_t *e8kv_pages_alloc(kv_pages *p, size_t n_bytes, uint32_t *slab);
/* Make sure n_pages pages of n_bytes can be allocated without a new slab: new slabs as large as the
 * shortfall. 0, or 1 when out of memory (then the slabs made here are released: nothing changed). */
int e8kv_pages_reserve(kv_pages *p, size_t n_bytes, size_t n_pages);
/* Give back a page of slab `slab`; its slab is released when it was the last page out. */
void e8kv_pages_free(kv_pages *p, uint8_t *page, uint32_t slab);
/* Bytes held: every live slab whole, and the slab and class tables (freed when no slab is live). */
size_t e8kv_pages_bytes(const kv_pages *p);
/* Bytes of the pages handed out (their strides): what e8kv_pages_bytes would be with no free page, no
 * slab header and no table. */
size_t e8kv_pages_live_bytes(const kv_pages *p);

/* Compaction. begin: in every class, mark for emptying the slabs with the fewest live pages, as many as
 * the other slabs' free pages can take in; when more than 1/E8KV_SLAB_WASTE_DIV of the remaining slabs'
 * pages would still be free, empty every slab with a free page into new slabs sized to what they hold
 * (best effort: skipped when out of memory). Returns the slabs marked (0: nothing to gain).
 * The owner then passes every page whose slab e8kv_pages_moving() names to e8kv_pages_move(), which gives
 * it a place in an unmarked slab (never a new one: it cannot fail), copies its bytes and frees the old
 * one; end puts any slab still marked back in service. */
size_t e8kv_pages_compact_begin(kv_pages *p);
int e8kv_pages_moving(const kv_pages *p, uint32_t slab);
/* O(1): some class has at least a slab's worth of free pages and more than 1/E8KV_SLAB_WASTE_DIV of its
 * pages free (worth a compaction where one is not due anyway). */
int e8kv_pages_wasteful(const kv_pages *p);
void e8kv_pages_move(kv_pages *p, uint8_t **page, uint32_t *slab);
void e8kv_pages_compact_end(kv_pages *p);

/* For tests: the live slabs (as allocated) through fn, then the tables (slabs, free ids, classes). */
void e8kv_pages_each_block(const kv_pages *p, void (*fn)(void *user, const void *block), void *user);

#endif
