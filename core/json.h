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

int cozy_json_encode(lua_State *L);
int cozy_json_copy(lua_State *L); /* json_value.c */
int cozy_json_diff(lua_State *L);

/* Pushes decode_buffer(pointer, length, projection), json.decode of bytes
** in C memory that end in a '\0' (the transport's answers), opening
** cozy.json if it is not yet. */
#define COZY_JSON_BUFFER_DECODER "cozy.json.decode_buffer"
void cozy_json_push_buffer_decoder(lua_State *L);
void cozy_json_open_scratch(lua_State *L);

#endif
