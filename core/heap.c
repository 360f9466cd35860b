/*
** The allocator of the engine's Lua states.
**
** A Lua state allocates and frees millions of small blocks (strings,
** tables, their parts): a rehearsal of 20,000 VMs spent a third of its CPU
** in glibc's malloc and free (fastbin consolidation, bin sorting), where
** the same process under a size-class allocator took a third less CPU
** (bench/README.md, "A heap of its own"). Lua tells its allocator the size
** of every block it frees or resizes, so a block needs no header: blocks of
** up to SMALL_MAX bytes come from one free list per size class (GRANULE
** steps), carved from slabs that the heap owns and frees when the state
** closes. Larger blocks go to malloc as before. A freed small block stays
** in its class for the state's next one of that size: memory of a class is
** never handed to another class or back to the system before the state
** closes, which the peak RSS of the benchmarks measures.
**
** Under AddressSanitizer every block is malloc's own, so that a use after
** free or an overflow of a Lua block is still caught.
*/
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"

#include "heap.h"

#if defined(__SANITIZE_ADDRESS__)
#define HEAP_POOLED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAP_POOLED 0
#endif
#endif
#ifndef HEAP_POOLED
#define HEAP_POOLED 1
#endif

#define GRANULE 16
#define SMALL_MAX 512
#define NCLASSES (SMALL_MAX / GRANULE)
#define SLAB_BYTES (256 * 1024)

/* A slab's header, a GRANULE long: the slab is malloc's (aligned to 16
** bytes on every platform Lua's blocks need more than 8), so every block
** carved after it is aligned as malloc's would be. */
union slab {
  union slab *next;
  char granule[GRANULE];
};

struct heap {
  void *free[NCLASSES]; /* per class, the freed blocks: each holds the next */
  char *bump, *end; /* the newest slab's part not yet carved */
  union slab *slabs; /* every slab, for heap_free */
};

static size_t class_of(size_t size) {
  return (size - 1) / GRANULE;
}

static void *small_acquire(struct heap *h, size_t size) {
  size_t c = class_of(size), bytes = (c + 1) * GRANULE;
  void *p = h->free[c];
  if (p != NULL) {
    memcpy(&h->free[c], p, sizeof(void *));
    /* the list's blocks lie anywhere in the heap, and reading the next
    ** one's link when it is taken was a cache miss per block (most of the
    ** allocator's time): fetch it now, while Lua fills this one */
    if (h->free[c] != NULL) __builtin_prefetch(h->free[c]);
    return p;
  }
  if ((size_t)(h->end - h->bump) < bytes) {
    /* the old slab's rest (less than SMALL_MAX bytes) is left unused */
    union slab *s = (union slab *)malloc(SLAB_BYTES);
    if (s == NULL) return NULL;
    s->next = h->slabs;
    h->slabs = s;
    h->bump = (char *)(s + 1);
    h->end = (char *)s + SLAB_BYTES;
  }
  p = h->bump;
  h->bump += bytes;
  return p;
}

static void small_release(struct heap *h, void *p, size_t size) {
  size_t c = class_of(size);
  memcpy(p, &h->free[c], sizeof(void *));
  h->free[c] = p;
}

static int is_small(size_t size) {
  return HEAP_POOLED && size <= SMALL_MAX;
}

/* lua_Alloc: ptr NULL is a new block (osize then names its type, not a
** size); otherwise osize is the block's size, as Lua always knows it. */
static void *heap_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  struct heap *h = (struct heap *)ud;
  void *p;
  if (ptr == NULL) osize = 0;
  if (nsize == 0) {
    if (ptr == NULL) return NULL;
    if (is_small(osize)) small_release(h, ptr, osize);
    else free(ptr);
    return NULL;
  }
  if (!is_small(osize) && !is_small(nsize)) return realloc(ptr, nsize);
  if (ptr != NULL && is_small(osize) && is_small(nsize) && class_of(osize) == class_of(nsize)) return ptr;
  p = is_small(nsize) ? small_acquire(h, nsize) : malloc(nsize);
  if (p == NULL) return NULL; /* ptr stays valid, as realloc leaves it */
  if (ptr != NULL) {
    memcpy(p, ptr, osize < nsize ? osize : nsize);
    if (is_small(osize)) small_release(h, ptr, osize);
    else free(ptr);
  }
  return p;
}

static void heap_free(struct heap *h) {
  while (h->slabs != NULL) {
    union slab *next = h->slabs->next;
    free(h->slabs);
    h->slabs = next;
  }
  free(h);
}

/* luaL_newstate's, which lauxlib does not export */
static int panic(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  if (msg == NULL) msg = "error object is not a string";
  fprintf(stderr, "PANIC: unprotected error in call to Lua API (%s)\n", msg);
  fflush(stderr);
  return 0; /* Lua aborts */
}

lua_State *cozy_state_new(void) {
  struct heap *h = (struct heap *)calloc(1, sizeof *h);
  lua_State *L;
  if (h == NULL) return NULL;
  L = lua_newstate(heap_alloc, h);
  if (L == NULL) {
    heap_free(h);
    return NULL;
  }
  lua_atpanic(L, panic);
  /* warnings off, as luaL_newstate starts them: nothing of the engine
  ** warns, and a migration's sandbox has no warn */
  lua_setwarnf(L, NULL, NULL);
  return L;
}

void cozy_state_close(lua_State *L) {
  void *h;
  lua_getallocf(L, &h);
  lua_close(L);
  heap_free((struct heap *)h);
}
