/* Internals shared by the parts of cozy.json (core/json.c decodes,
** core/json_encode.c encodes, core/json_value.c copies and compares).
** Not an API: Lua code sees only the module. */
#ifndef COZY_JSON_H
#define COZY_JSON_H

#include <stddef.h>
#include <string.h>

#include "lua.h"

/* Deepest nesting of arrays and objects accepted by decode and produced by
** encode. Bounds C recursion; on encode it is also how a cycle is caught. */
#define COZY_JSON_MAX_DEPTH 1000
#define COZY_JSON_STR_(x) #x
#define COZY_JSON_STR(x) COZY_JSON_STR_(x)

/* Upvalues shared by every function of the module (luaL_setfuncs). */
#define COZY_JSON_ARRAY_MT lua_upvalueindex(1)
#define COZY_JSON_OBJECT_MT lua_upvalueindex(2)
#define COZY_JSON_CJSON_DECODE lua_upvalueindex(3)
#define COZY_JSON_CJSON_ENCODE lua_upvalueindex(4)

/* Length of the well-formed UTF-8 sequence starting at p (a byte >= 0x80),
** or 0 when it is not one: overlong forms, UTF-16 surrogates (U+D800..DFFF),
** code points above U+10FFFF, stray continuation bytes and truncated
** sequences are all rejected (Unicode 15, table 3-7). Lua strings end in a
** '\0', which is never a continuation byte, so reading stops in bounds. */
static inline size_t cozy_json_utf8_len(const unsigned char *p) {
  unsigned c = p[0];
#define CONT(b) ((b) >= 0x80 && (b) <= 0xBF)
  if (c >= 0xC2 && c <= 0xDF) return CONT(p[1]) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    unsigned lo = (c == 0xE0) ? 0xA0 : 0x80, hi = (c == 0xED) ? 0x9F : 0xBF;
    return (p[1] >= lo && p[1] <= hi && CONT(p[2])) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    unsigned lo = (c == 0xF0) ? 0x90 : 0x80, hi = (c == 0xF4) ? 0x8F : 0xBF;
    return (p[1] >= lo && p[1] <= hi && CONT(p[2]) && CONT(p[3])) ? 4 : 0;
  }
#undef CONT
  return 0;
}

/* 1 for the bytes that end a run of plain string content: '"', '\\',
** control characters (the '\0' after every Lua string among them) and the
** bytes of multi-byte UTF-8 sequences. */
extern const unsigned char cozy_json_string_stop[256];

/* A key of an object being encoded or compared, to sort: its bytes and
** the stack slot of the key. Encode and diff order keys the same way,
** bytewise (a prefix first), so they share the comparison. */
typedef struct CozyJsonKey {
  const char *s;
  size_t len;
  int slot;
} CozyJsonKey;

static inline int cozy_json_key_cmp(const void *va, const void *vb) {
  const CozyJsonKey *a = (const CozyJsonKey *)va, *b = (const CozyJsonKey *)vb;
  int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
  if (c != 0) return c;
  return (a->len > b->len) - (a->len < b->len);
}

/* Memory one encode or diff call owns: a text that grows (the output of
** encode, the RFC 6901 pointer diff is at) and a stack of keys shared by the
** nested objects (each level uses the part above its parent's). */
typedef struct CozyJsonScratch {
  char *buf;
  size_t len, cap;
  CozyJsonKey *keys;
  size_t nkeys, keycap;
} CozyJsonScratch;

/* Pushes an empty scratch as a to-be-closed value: its memory is freed when
** the calling C function returns, or when an error unwinds it. */
CozyJsonScratch *cozy_json_push_scratch(lua_State *L);
/* Makes room for `need` more bytes after the `len` in use of s's text. */
void cozy_json_text_room(lua_State *L, CozyJsonScratch *s, size_t need);
/* Makes room for one more key above the `used` keys of s's key stack. */
void cozy_json_key_room(lua_State *L, CozyJsonScratch *s, size_t used);

/* Projections (core/json_projection.c): a table tree saying which parts
** to build (json.decode's second argument; checked before decoding starts).
** In an object, key k is built with projection proj[k], else proj["*"];
** `true` builds the whole subtree, a table descends, no entry skips the
** value. Every element of an array is built with proj["*"]. A scalar met
** by a table projection is kept as it is.
**
** Decoding uses the tables compiled into CozyJsonProj nodes: most keys of
** a projected object are skipped, and looking a key up in its Lua table
** first made it a Lua string, hashed and interned, about 300 instructions
** a key. A node finds the key's bytes among its names, and
** only a key that is kept becomes a Lua string. */
typedef struct CozyJsonProj CozyJsonProj;

typedef struct CozyJsonProjKey {
  const char *name; /* a key of the projection table, which holds it */
  size_t len;
  const CozyJsonProj *sub; /* its projection: COZY_JSON_KEEP for true, NULL for false (left
                           ** out even where "*" would keep it), else its table's node */
} CozyJsonProjKey;

struct CozyJsonProj {
  const CozyJsonProjKey *keys; /* the keys but "*", sorted by length, then bytes */
  size_t nkeys;
  const CozyJsonProj *star; /* proj["*"]: NULL (skip), COZY_JSON_KEEP or a node */
};

/* The projection `true` (and no projection): the whole value is built. */
extern const CozyJsonProj cozy_json_keep;
#define COZY_JSON_KEEP (&cozy_json_keep)

/* The projection argument at idx (none, nil, true or a table), checked and
** compiled: COZY_JSON_KEEP, or the root node of a compiled table, held in a
** userdata pushed above idx (the stack is cut to idx first) until the
** caller returns. Raises an argument error naming the offending entry. */
const CozyJsonProj *cozy_json_projection(lua_State *L, int idx);

/* The projection of the key `name` (its decoded bytes) in an object that
** proj projects: its entry, else proj["*"], NULL when it is skipped. Inline:
** a projected decode looks up every key. */
static inline const CozyJsonProj *cozy_json_key_projection(const CozyJsonProj *proj, const char *name,
                                                           size_t len) {
  size_t lo = 0, hi = proj->nkeys;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const CozyJsonProjKey *k = &proj->keys[mid];
    int c = k->len != len ? (k->len < len ? -1 : 1) : memcmp(k->name, name, len);
    if (c == 0) return k->sub;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return proj->star;
}

int cozy_json_encode(lua_State *L);
int cozy_json_copy(lua_State *L); /* json_value.c */
int cozy_json_diff(lua_State *L);
int cozy_json_holds(lua_State *L);

/* Pushes decode_buffer(pointer, length, projection), json.decode of bytes
** in C memory that end in a '\0' (the transport's answers), opening
** cozy.json if it is not yet. */
#define COZY_JSON_BUFFER_DECODER "cozy.json.decode_buffer"
void cozy_json_push_buffer_decoder(lua_State *L);
void cozy_json_open_scratch(lua_State *L);

#endif
