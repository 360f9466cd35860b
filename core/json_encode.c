/*
** cozy.json, encoding half (see core/json.c for the design).
**
** Rules, in the order they are applied to a table:
**  - metatable json.array_mt: an array; its keys must be exactly 1..n;
**  - metatable json.object_mt: an object; its keys must be strings;
**  - otherwise the first key decides: none gives `{}` (an empty table that
**    nobody marked is an object), an integer an array, a string an object;
**    the rest of the keys must agree, and arrays must have no holes (use
**    json.null), or the encode fails naming where.
** Object keys come out sorted bytewise, so output is deterministic (plans,
** diffs and tests compare it as text). Integers print exactly; floats print
** the shortest of %.15g/%.16g/%.17g that reads back to the same double, with
** ".0" appended when it would otherwise read back as an integer. Strings are
** checked for valid UTF-8; one that needs escaping goes through lua-cjson's
** encoder, whose "\/" we turn back into "/".
** Errors longjmp out of the recursion, so the output buffer lives in a
** to-be-closed userdata that frees it either way.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "json.h"

#define SCRATCH_MT "cozy.json.scratch"

typedef CozyJsonKey KeyRef;

typedef CozyJsonScratch Scratch;

/* Where in the value the encoder is, for error messages only. */
typedef struct Path {
  const struct Path *up;
  const char *key; /* NULL: an array element */
  size_t klen;
  lua_Integer index;
} Path;

typedef struct Encoder {
  lua_State *L;
  Scratch *out;
  int depth;
} Encoder;

static int scratch_free(lua_State *L) {
  Scratch *o = (Scratch *)luaL_checkudata(L, 1, SCRATCH_MT);
  free(o->buf);
  free(o->keys);
  memset(o, 0, sizeof *o);
  return 0;
}

CozyJsonScratch *cozy_json_push_scratch(lua_State *L) {
  Scratch *o = (Scratch *)lua_newuserdatauv(L, sizeof *o, 0);
  memset(o, 0, sizeof *o);
  luaL_setmetatable(L, SCRATCH_MT);
  lua_toclose(L, lua_gettop(L));
  return o;
}

void cozy_json_text_room(lua_State *L, CozyJsonScratch *o, size_t need) {
  size_t cap = o->cap ? o->cap : 1024;
  char *nb;
  if (o->cap - o->len >= need) return;
  while (cap - o->len < need) {
    if (cap > SIZE_MAX / 2) luaL_error(L, "cozy.json: output too large");
    cap *= 2;
  }
  nb = (char *)realloc(o->buf, cap);
  if (nb == NULL) luaL_error(L, "cozy.json: not enough memory");
  o->buf = nb;
  o->cap = cap;
}

void cozy_json_key_room(lua_State *L, CozyJsonScratch *o, size_t used) {
  size_t cap;
  KeyRef *nk;
  if (used < o->keycap) return;
  cap = o->keycap ? o->keycap * 2 : 64;
  if (cap > SIZE_MAX / sizeof *nk) luaL_error(L, "cozy.json: not enough memory");
  nk = (KeyRef *)realloc(o->keys, cap * sizeof *nk);
  if (nk == NULL) luaL_error(L, "cozy.json: not enough memory");
  o->keys = nk;
  o->keycap = cap;
}

/* Appends a key as a Lua string literal's contents would show it: the
** message itself must stay valid UTF-8 (it may end up in a JSON log line),
** so bytes that are not are written as \xHH. */
static void add_quoted(luaL_Buffer *b, const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s, *end = p + len;
  while (p < end) {
    size_t n = *p >= 0x80 ? cozy_json_utf8_len(p) : 1;
    if (n == 0 || p + n > end || *p < 0x20 || *p == 0x7F || *p == '"' || *p == '\\') {
      char hex[8];
      snprintf(hex, sizeof hex, "\\x%02X", *p);
      luaL_addstring(b, hex);
      n = 1;
    } else {
      luaL_addlstring(b, (const char *)p, n);
    }
    p += n;
  }
}

/* Appends the path to w, root first; past `left` segments (a cycle makes
** a thousand) the rest toward the root is elided as "...". */
static void add_path(luaL_Buffer *b, const Path *w, int left) {
  const char *p;
  if (left == 0) {
    luaL_addstring(b, "...");
    return;
  }
  if (w->up != NULL) add_path(b, w->up, left - 1);
  if (w->key == NULL) {
    lua_pushfstring(b->L, "[%I]", w->index);
    luaL_addvalue(b);
    return;
  }
  for (p = w->key; p < w->key + w->klen; p++) /* a Lua identifier? */
    if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (p > w->key && *p >= '0' && *p <= '9')))
      break;
  if (w->klen > 0 && p == w->key + w->klen) {
    if (w->up != NULL) luaL_addchar(b, '.');
    luaL_addlstring(b, w->key, w->klen);
  } else {
    luaL_addstring(b, "[\"");
    add_quoted(b, w->key, w->klen > 60 ? 60 : w->klen);
    luaL_addstring(b, w->klen > 60 ? "...\"]" : "\"]");
  }
}

/* Raises "cozy.json: cannot encode <what> at <path>". */
static int encode_error(Encoder *E, const Path *w, const char *what) {
  lua_State *L = E->L;
  luaL_Buffer b;
  luaL_checkstack(L, 8, "cozy.json: error message");
  lua_pushstring(L, what); /* what may live in a buffer of the caller's */
  luaL_buffinit(L, &b);
  if (w == NULL) luaL_addstring(&b, "(root)");
  else add_path(&b, w, 24);
  luaL_pushresult(&b);
  return luaL_error(L, "cozy.json: cannot encode %s at %s", lua_tostring(L, -2), lua_tostring(L, -1));
}

static void put(Encoder *E, const char *s, size_t n) {
  if (E->out->cap - E->out->len < n) cozy_json_text_room(E->L, E->out, n);
  memcpy(E->out->buf + E->out->len, s, n);
  E->out->len += n;
}

static void put_char(Encoder *E, char c) {
  if (E->out->cap == E->out->len) cozy_json_text_room(E->L, E->out, 1);
  E->out->buf[E->out->len++] = c;
}

/* Appends cjson's encoding of a string, with its "\/" (cjson escapes every
** '/') turned back into "/"; any other escape is kept as cjson wrote it. */
static void put_cjson_string(Encoder *E, const char *s, size_t n) {
  const char *end = s + n, *bs;
  while ((bs = memchr(s, '\\', (size_t)(end - s))) != NULL) {
    put(E, s, (size_t)(bs - s));
    if (bs[1] == '/') put_char(E, '/');
    else put(E, bs, 2);
    s = bs + 2;
  }
  put(E, s, (size_t)(end - s));
}

/* The string at stack index idx. */
static void encode_string(Encoder *E, int idx, const Path *w) {
  size_t len;
  const char *s = lua_tolstring(E->L, idx, &len);
  const unsigned char *p = (const unsigned char *)s, *end = p + len;
  int escape = 0;
  for (;;) {
    while (!cozy_json_string_stop[*p]) p++;
    if (p >= end) break; /* the '\0' after the string */
    if (*p < 0x80) {
      escape = 1;
      p++;
    } else {
      size_t n = cozy_json_utf8_len(p);
      if (n == 0 || p + n > end) {
        char what[64];
        snprintf(what, sizeof what, "a string with invalid UTF-8 (byte %lu of it)",
                 (unsigned long)(p - (const unsigned char *)s) + 1);
        encode_error(E, w, what);
      }
      p += n;
    }
  }
  if (!escape) {
    if (E->out->cap - E->out->len < len + 2) cozy_json_text_room(E->L, E->out, len + 2);
    E->out->buf[E->out->len++] = '"';
    memcpy(E->out->buf + E->out->len, s, len);
    E->out->len += len;
    E->out->buf[E->out->len++] = '"';
  } else {
    lua_State *L = E->L;
    luaL_checkstack(L, 2, "cozy.json: string");
    lua_pushvalue(L, COZY_JSON_CJSON_ENCODE);
    lua_pushvalue(L, idx);
    lua_call(L, 1, 1);
    s = lua_tolstring(L, -1, &len);
    put_cjson_string(E, s, len);
    lua_pop(L, 1);
  }
}

static void encode_integer(Encoder *E, lua_Integer v) {
  char buf[24], *p = buf + sizeof buf;
  uint64_t u = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
  do {
    *--p = (char)('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (v < 0) *--p = '-';
  put(E, p, (size_t)(buf + sizeof buf - p));
}

/* The shortest of %.15g, %.16g, %.17g that reads back as the same double
** (%.17g always does); lua-cjson stops at 14 digits, which is the loss. */
static void encode_float(Encoder *E, double x, const Path *w) {
  char buf[40];
  int prec, n = 0, i, plain = 1;
  if (isnan(x) || isinf(x)) encode_error(E, w, isnan(x) ? "NaN" : "an infinite number");
  for (prec = 15; prec <= 17; prec++) {
    n = snprintf(buf, sizeof buf - 2, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  for (i = 0; i < n; i++) {
    char c = buf[i];
    if (c == 'e') plain = 0;
    else if (!(c == '-' || c == '+' || (c >= '0' && c <= '9'))) {
      buf[i] = '.'; /* the decimal point, whatever the C locale says */
      plain = 0;
    }
  }
  if (plain) { /* 2.0 must not come back as the integer 2 */
    buf[n++] = '.';
    buf[n++] = '0';
  }
  put(E, buf, (size_t)n);
}

static void encode_value(Encoder *E, int idx, const Path *w);

static void sort_keys(KeyRef *k, size_t n);

/* Describes a key that does not belong, for an error message. */
static const char *describe_key(lua_State *L, int idx) {
  switch (lua_type(L, idx)) {
    case LUA_TSTRING: return lua_pushfstring(L, "key \"%s\"", lua_tostring(L, idx));
    case LUA_TNUMBER:
      return lua_isinteger(L, idx) ? lua_pushfstring(L, "key %I", lua_tointeger(L, idx))
                                   : lua_pushfstring(L, "key %f", lua_tonumber(L, idx));
    default: return lua_pushfstring(L, "a %s key", luaL_typename(L, idx));
  }
}

static void encode_array(Encoder *E, int idx, int marked, const Path *w) {
  lua_State *L = E->L;
  lua_Integer n = 0, max = 0, i;
  Path seg;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_Integer k;
    lua_pop(L, 1);
    k = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
    if (k < 1) {
      const char *key = describe_key(L, -1);
      encode_error(
          E, w,
          lua_pushfstring(
              L, marked ? "an array (json.array_mt) with %s" : "a table with mixed keys (1.. and %s)", key));
    }
    n++;
    if (k > max) max = k;
  }
  if (max != n)
    encode_error(E, w,
                 lua_pushfstring(L,
                                 "a sparse array (%I elements, highest index %I; "
                                 "json.null fills a hole)",
                                 n, max));
  seg.up = w;
  seg.key = NULL;
  seg.klen = 0;
  put_char(E, '[');
  for (i = 1; i <= n; i++) {
    if (i > 1) put_char(E, ',');
    lua_rawgeti(L, idx, i);
    seg.index = i;
    encode_value(E, lua_gettop(L), &seg);
    lua_pop(L, 1);
  }
  put_char(E, ']');
}

static void encode_object(Encoder *E, int idx, int marked, const Path *w) {
  lua_State *L = E->L;
  Scratch *o = E->out;
  int base = lua_gettop(L);
  size_t k0 = o->nkeys, n = 0, i;
  Path seg;
  /* every key and value stays on the stack (k1 v1 k2 v2 ...) while sorted */
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING) {
      const char *key = describe_key(L, -2);
      encode_error(E, w,
                   lua_pushfstring(L,
                                   marked ? "an object (json.object_mt) with %s"
                                          : "a table with mixed keys (strings and %s)",
                                   key));
    }
    if (k0 + n == o->keycap) cozy_json_key_room(L, o, k0 + n);
    o->keys[k0 + n].s = lua_tolstring(L, -2, &o->keys[k0 + n].len);
    o->keys[k0 + n].slot = lua_gettop(L) - 1;
    n++;
    luaL_checkstack(L, 3, "cozy.json: object too large to encode");
    lua_pushvalue(L, -2);
  }
  if (n > 1) sort_keys(o->keys + k0, n); /* keys is NULL before the first key: no NULL + 0 */
  o->nkeys = k0 + n; /* nested objects stack their keys above ours */
  seg.up = w;
  seg.index = 0;
  put_char(E, '{');
  for (i = 0; i < n; i++) {
    const KeyRef *k = &o->keys[k0 + i]; /* re-read: nested objects may realloc */
    int slot = k->slot;
    seg.key = k->s;
    seg.klen = k->len;
    if (i > 0) put_char(E, ',');
    encode_string(E, slot, &seg);
    put_char(E, ':');
    encode_value(E, slot + 1, &seg);
  }
  put_char(E, '}');
  o->nkeys = k0;
  lua_settop(L, base);
}

static void encode_table(Encoder *E, int idx, const Path *w) {
  lua_State *L = E->L;
  int array, marked = 0;
  if (++E->depth > COZY_JSON_MAX_DEPTH)
    encode_error(E, w, "a table nested deeper than " COZY_JSON_STR(COZY_JSON_MAX_DEPTH) " levels (a cycle?)");
  luaL_checkstack(L, 6, "cozy.json: nesting");
  if (lua_getmetatable(L, idx)) {
    if (lua_rawequal(L, -1, COZY_JSON_ARRAY_MT)) marked = 'a';
    else if (lua_rawequal(L, -1, COZY_JSON_OBJECT_MT)) marked = 'o';
    lua_pop(L, 1);
  }
  if (marked) {
    array = (marked == 'a');
  } else {
    lua_pushnil(L);
    if (!lua_next(L, idx)) {
      put(E, "{}", 2);
      E->depth--;
      return;
    }
    array = lua_type(L, -2) == LUA_TNUMBER;
    lua_pop(L, 2);
  }
  if (array) encode_array(E, idx, marked, w);
  else encode_object(E, idx, marked, w);
  E->depth--;
}

static void encode_value(Encoder *E, int idx, const Path *w) {
  lua_State *L = E->L;
  switch (lua_type(L, idx)) {
    case LUA_TSTRING: encode_string(E, idx, w); break;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) encode_integer(E, lua_tointeger(L, idx));
      else encode_float(E, lua_tonumber(L, idx), w);
      break;
    case LUA_TBOOLEAN:
      if (lua_toboolean(L, idx)) put(E, "true", 4);
      else put(E, "false", 5);
      break;
    case LUA_TTABLE: encode_table(E, idx, w); break;
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) == NULL) {
        put(E, "null", 4);
        break;
      }
      /* FALLTHROUGH */
    default:
      encode_error(E, w,
                   lua_pushfstring(L, "a %s value%s", luaL_typename(L, idx),
                                   lua_isnil(L, idx) ? " (json.null is JSON's null)" : ""));
  }
}

/* Kubernetes objects have a handful of keys per level: insertion sort wins
** there; qsort takes the big ones (ConfigMap data, labels). */
static void sort_keys(KeyRef *k, size_t n) {
  size_t i, j;
  if (n > 16) {
    qsort(k, n, sizeof *k, cozy_json_key_cmp);
    return;
  }
  for (i = 1; i < n; i++) {
    KeyRef t = k[i];
    for (j = i; j > 0 && cozy_json_key_cmp(&k[j - 1], &t) > 0; j--) k[j] = k[j - 1];
    k[j] = t;
  }
}

int cozy_json_encode(lua_State *L) {
  Encoder E;
  Scratch *o;
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  o = cozy_json_push_scratch(L); /* 2: freed however the call ends */
  E.L = L;
  E.out = o;
  E.depth = 0;
  encode_value(&E, 1, NULL);
  lua_pushlstring(L, o->buf ? o->buf : "", o->len);
  return 1;
}

/* The scratch's type, for encode and for diff (json_value.c). */
void cozy_json_open_scratch(lua_State *L) {
  if (luaL_newmetatable(L, SCRATCH_MT)) {
    lua_pushcfunction(L, scratch_free);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, scratch_free);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
}
