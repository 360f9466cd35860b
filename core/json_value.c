/*
** cozy.json, values part: json.copy(v), json.diff(a, b [, exact]) and
** json.holds(v, key, value, max_depth): the deep copy
** and the RFC 6902 difference behind every change cozy.kube sends (the
** engine edits a copy of the object and sends what differs). Both walk the
** whole object for every write, which made them a tenth of a fleet run's
** CPU in Lua (bench/README.md).
**
** Tables are read raw, as the encoder reads them: __index, __pairs and
** __len are not consulted.
**
** json.copy(v): v itself unless it is a table; else a new table with the
** same keys (not copied) and copies of the values, marked as the original
** when it carries json.array_mt or json.object_mt. Any other metatable is
** left behind: a copy is data, and behaviour such as a __gc or an __index
** must not be duplicated (the encoder ignores it too, so the copy encodes
** as the original). A value that appears twice is copied twice.
**
** json.diff(a, b): the array of ops (json.array_mt; each op a plain table
** { op =, path =, value = }) that turns a into b, as narrow as the
** difference:
**  - equal values (raw equality: 1 and 1.0 are one JSON number) give
**    nothing, and so do two empty tables, as [] and {} compare equal;
**  - a value whose type changed, or a table that changed between array
**    and object, is one `replace` with a copy of b's value. A table is an
**    array when it carries json.array_mt, an object with json.object_mt,
**    else when it has a [1];
**  - arrays compare element by element where both have one; b's extra
**    elements are `add` to "/-" in order, a's extra ones are `remove`d
**    from the last;
**  - objects compare key by key in sorted order (bytewise, as the encoder
**    sorts; by their tostring text when some key is not a string): a key
**    only b has is an `add` of a copy, a key only a has a `remove`;
**  - paths are RFC 6901 pointers: "/" and "~" in keys as "~1" and "~0",
**    array elements by their 0-based index.
** Values in the ops are copies: the ops can be kept while b changes.
**
** json.diff(a, b, true), the exact mode: the same ops, or nil when they
** would not give b back exactly as json.encode prints it, because the
** equality above took two values for one that print apart: 1 and 1.0,
** 0.0 and -0.0, an empty [] and {}; or a table kept from a where b's has
** another metatable, or an object with a key that is not a string. It is
** conservative (an unmarked table against a marked one that prints alike
** is nil too): nil costs the caller a fallback, never a wrong answer. The
** rehearsal keeps an object's before as the patch from the object back to
** it only when this gives one (a patch back and two encodes to check it
** were most of a write's cost in a plan).
**
** json.holds(v, key, value, max_depth): whether some table in v (v
** included) has t[key] raw-equal to value, or v holds a table deeper than
** max_depth (v itself at depth 0): there the caller cannot know. The
** rehearsal asks it whether an object holds a Secret anywhere (what
** cozy.kube.trace redacts), to copy it only when it does: the plan's diff
** of every VM it changed went through that copy (bench/README.md).
**
** Limits: nesting deeper than json.max_depth raises (that is also how a
** cycle ends), counted from the root for diff, the values of its ops
** included: "cozy.json: cannot copy|diff a table nested deeper than ...".
** The keys that differ wait on the Lua stack while their object is
** compared, so about a million of them at once raise "object too large to
** compare" (a Kubernetes object is at most 1.5 MB).
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "json.h"

/* A key of the object being compared: its text and stack slot. */
typedef CozyJsonKey KeyRef;

/* One diff call: its scratch holds the RFC 6901 pointer of the value being
** compared (buf) and the keys of the objects being compared. */
typedef struct Differ {
  lua_State *L;
  CozyJsonScratch *w;
  int ops; /* stack index of the result */
  lua_Integer nops;
  int depth;
  int exact; /* the exact mode: */
  int inexact; /* the ops would not give b back exactly */
} Differ;

static void too_deep(lua_State *L, const char *what) {
  luaL_error(L,
             "cozy.json: cannot %s a table nested deeper than " COZY_JSON_STR(
                 COZY_JSON_MAX_DEPTH) " levels (a cycle?)",
             what);
}

/* Pushes a copy of the value at idx (absolute), a table at `depth` (1: the
** root); `what` names the call in an error. */
static void copy_value(lua_State *L, int idx, int depth, const char *what) {
  int t;
  lua_Integer n = 0, total = 0;
  if (lua_type(L, idx) != LUA_TTABLE) {
    lua_pushvalue(L, idx);
    return;
  }
  if (depth > COZY_JSON_MAX_DEPTH) too_deep(L, what);
  luaL_checkstack(L, 6, "cozy.json: nesting");
  /* sized as the original: growing it key by key would rehash it */
  n = (lua_Integer)lua_rawlen(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    total++;
    lua_pop(L, 1);
  }
  if (n > total) n = total; /* a border past holes: only a size hint */
  lua_createtable(L, n > INT_MAX ? INT_MAX : (int)n, total - n > INT_MAX ? INT_MAX : (int)(total - n));
  t = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, idx)) { /* t ... k v */
    if (lua_type(L, -1) == LUA_TTABLE) {
      copy_value(L, lua_gettop(L), depth + 1, what);
      lua_replace(L, -2);
    }
    lua_pushvalue(L, -2);
    lua_insert(L, -2); /* k k v */
    lua_rawset(L, t);
  }
  if (lua_getmetatable(L, idx)) {
    if (lua_rawequal(L, -1, COZY_JSON_ARRAY_MT) || lua_rawequal(L, -1, COZY_JSON_OBJECT_MT))
      lua_setmetatable(L, t);
    else lua_pop(L, 1);
  }
}

/* json.copy(v) */
int cozy_json_copy(lua_State *L) {
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  copy_value(L, 1, 1, "copy");
  return 1;
}

/* Whether the table at idx (absolute), at `depth`, or a table in it has
** [key] raw-equal to value (stack slots 2 and 3) or lies deeper than
** max_depth. */
static int holds_value(lua_State *L, int idx, int depth, int max_depth) {
  int found = 0;
  if (depth > max_depth) return 1;
  luaL_checkstack(L, 4, "cozy.json: nesting");
  lua_pushvalue(L, 2);
  lua_rawget(L, idx);
  found = lua_rawequal(L, -1, 3);
  lua_pop(L, 1);
  lua_pushnil(L);
  while (!found && lua_next(L, idx)) {
    if (lua_type(L, -1) == LUA_TTABLE) found = holds_value(L, lua_gettop(L), depth + 1, max_depth);
    lua_pop(L, 1);
  }
  if (found) lua_pop(L, 1); /* the key lua_next left */
  return found;
}

/* json.holds(v, key, value, max_depth) */
int cozy_json_holds(lua_State *L) {
  lua_Integer max_depth;
  luaL_checkany(L, 1);
  luaL_checkany(L, 2);
  luaL_checkany(L, 3);
  max_depth = luaL_checkinteger(L, 4);
  if (max_depth > COZY_JSON_MAX_DEPTH) max_depth = COZY_JSON_MAX_DEPTH;
  if (max_depth < -1) max_depth = -1;
  lua_settop(L, 4);
  lua_pushboolean(L, lua_type(L, 1) == LUA_TTABLE && holds_value(L, 1, 0, (int)max_depth));
  return 1;
}

/* Appends s to the pointer, escaped as RFC 6901 says; returns the length
** to truncate back to. */
static size_t push_token(Differ *D, const char *s, size_t n) {
  CozyJsonScratch *w = D->w;
  size_t mark = w->len, i;
  if (w->cap - w->len < 2 * n + 1) cozy_json_text_room(D->L, w, 2 * n + 1);
  w->buf[w->len++] = '/';
  for (i = 0; i < n; i++) {
    char c = s[i];
    if (c == '~' || c == '/') {
      w->buf[w->len++] = '~';
      w->buf[w->len++] = c == '~' ? '0' : '1';
    } else {
      w->buf[w->len++] = c;
    }
  }
  return mark;
}

static size_t push_index(Differ *D, lua_Integer i) {
  char buf[24];
  int n = snprintf(buf, sizeof buf, LUA_INTEGER_FMT, (LUAI_UACINT)i);
  return push_token(D, buf, (size_t)n);
}

/* Appends { op = op, path = <the pointer>, value = copy of value_idx } to
** the result (value_idx 0: no value). */
static void emit(Differ *D, const char *op, int value_idx) {
  lua_State *L = D->L;
  luaL_checkstack(L, 4, "cozy.json: diff");
  lua_createtable(L, 0, value_idx ? 3 : 2);
  lua_pushstring(L, op);
  lua_setfield(L, -2, "op");
  lua_pushlstring(L, D->w->buf ? D->w->buf : "", D->w->len);
  lua_setfield(L, -2, "path");
  if (value_idx) {
    copy_value(L, value_idx, D->depth + 1, "diff");
    lua_setfield(L, -2, "value");
  }
  lua_rawseti(L, D->ops, ++D->nops);
}

/* 'a' for an array, 'o' for an object (a table at idx). */
static int table_kind(lua_State *L, int idx) {
  int kind = 0;
  if (lua_getmetatable(L, idx)) {
    kind = lua_rawequal(L, -1, COZY_JSON_ARRAY_MT) ? 'a' : lua_rawequal(L, -1, COZY_JSON_OBJECT_MT) ? 'o' : 0;
    lua_pop(L, 1);
  }
  if (kind == 0) {
    kind = lua_rawgeti(L, idx, 1) != LUA_TNIL ? 'a' : 'o';
    lua_pop(L, 1);
  }
  return kind;
}

static int is_empty(lua_State *L, int idx) {
  lua_pushnil(L);
  if (!lua_next(L, idx)) return 1;
  lua_pop(L, 2);
  return 0;
}

static void diff_value(Differ *D, int a, int b);

/* The exact mode's checks, of values diff takes as one. */
static int same_number(lua_State *L, int a, int b) {
  lua_Number x, y;
  if (lua_isinteger(L, a) != lua_isinteger(L, b)) return 0;
  if (lua_isinteger(L, a)) return 1; /* raw-equal integers */
  x = lua_tonumber(L, a);
  y = lua_tonumber(L, b);
  return memcmp(&x, &y, sizeof x) == 0; /* 0.0 and -0.0 print apart */
}

static int same_metatable(lua_State *L, int a, int b) {
  int ma = lua_getmetatable(L, a), mb = lua_getmetatable(L, b), same = ma == mb;
  if (ma && mb) same = lua_rawequal(L, -1, -2);
  lua_pop(L, ma + mb);
  return same;
}

static void diff_array(Differ *D, int a, int b) {
  lua_State *L = D->L;
  lua_Integer na = (lua_Integer)lua_rawlen(L, a), nb = (lua_Integer)lua_rawlen(L, b);
  lua_Integer common = na < nb ? na : nb, i;
  size_t mark;
  for (i = 1; i <= common; i++) {
    lua_rawgeti(L, a, i);
    lua_rawgeti(L, b, i);
    mark = push_index(D, i - 1);
    diff_value(D, lua_gettop(L) - 1, lua_gettop(L));
    D->w->len = mark;
    lua_pop(L, 2);
  }
  for (i = common + 1; i <= nb; i++) {
    mark = push_token(D, "-", 1);
    lua_rawgeti(L, b, i);
    emit(D, "add", lua_gettop(L));
    lua_pop(L, 1);
    D->w->len = mark;
  }
  for (i = na; i > common; i--) {
    mark = push_index(D, i - 1);
    emit(D, "remove", 0);
    D->w->len = mark;
  }
}

/* Pushes the key at the top again below it (..., kept, key) when the
** objects differ there, recording it; the key stays on top for lua_next. */
static void keep_key(Differ *D, size_t *n) {
  lua_State *L = D->L;
  CozyJsonScratch *w = D->w;
  luaL_checkstack(L, 3, "cozy.json: object too large to compare");
  lua_pushvalue(L, -1);
  lua_insert(L, -2);
  if (w->nkeys + *n == w->keycap) cozy_json_key_room(L, w, w->nkeys + *n);
  w->keys[w->nkeys + *n].slot = lua_gettop(L) - 1;
  (*n)++;
}

static void diff_object(Differ *D, int a, int b) {
  lua_State *L = D->L;
  CozyJsonScratch *w = D->w;
  int top = lua_gettop(L), strings = 1;
  size_t k0 = w->nkeys, n = 0, i;
  /* the keys whose values are not the same value, then those only b has;
  ** kept on the stack, below the key lua_next walks with */
  lua_pushnil(L);
  while (lua_next(L, a)) { /* k v */
    int same;
    lua_pushvalue(L, -2);
    lua_rawget(L, b);
    same = lua_rawequal(L, -1, -2);
    if (same && D->exact && lua_type(L, -1) == LUA_TNUMBER && !same_number(L, -1, -2)) D->inexact = 1;
    lua_pop(L, 2);
    if (!same) {
      strings = strings && lua_type(L, -1) == LUA_TSTRING;
      keep_key(D, &n);
    }
  }
  lua_pushnil(L);
  while (lua_next(L, b)) {
    int absent;
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    absent = lua_rawget(L, a) == LUA_TNIL;
    lua_pop(L, 1);
    if (absent) {
      strings = strings && lua_type(L, -1) == LUA_TSTRING;
      keep_key(D, &n);
    }
  }
  /* each key's text: the string itself, else its tostring (pushed) */
  for (i = 0; i < n; i++) {
    KeyRef *k = &w->keys[k0 + i];
    if (!strings) {
      luaL_checkstack(L, 2, "cozy.json: object too large to compare");
      luaL_tolstring(L, k->slot, NULL);
    }
    k->s = lua_tolstring(L, strings ? k->slot : -1, &k->len);
  }
  if (!strings) D->inexact = 1; /* (only the exact mode reads it) */
  if (n > 1) qsort(w->keys + k0, n, sizeof *w->keys, cozy_json_key_cmp);
  w->nkeys = k0 + n; /* nested objects stack their keys above ours */
  for (i = 0; i < n; i++) {
    const KeyRef *k = &w->keys[k0 + i]; /* re-read: nested objects may realloc */
    int slot = k->slot;
    size_t mark = push_token(D, k->s, k->len);
    lua_pushvalue(L, slot);
    if (lua_rawget(L, b) == LUA_TNIL) {
      emit(D, "remove", 0);
    } else {
      lua_pushvalue(L, slot);
      if (lua_rawget(L, a) == LUA_TNIL) emit(D, "add", lua_gettop(L) - 1);
      else diff_value(D, lua_gettop(L), lua_gettop(L) - 1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
    D->w->len = mark;
  }
  w->nkeys = k0;
  lua_settop(L, top);
}

/* The ops that turn the value at a into the one at b (absolute indices),
** appended at the current pointer. */
static void diff_value(Differ *D, int a, int b) {
  lua_State *L = D->L;
  int kind;
  luaL_checkstack(L, 8, "cozy.json: nesting");
  if (D->exact && D->inexact) return; /* the answer is nil: no more to do */
  if (lua_rawequal(L, a, b)) {
    if (D->exact && lua_type(L, a) == LUA_TNUMBER && !same_number(L, a, b)) D->inexact = 1;
    return;
  }
  if (lua_type(L, a) != LUA_TTABLE || lua_type(L, b) != LUA_TTABLE) {
    emit(D, "replace", b);
    return;
  }
  if (is_empty(L, a) && is_empty(L, b)) {
    if (D->exact && !same_metatable(L, a, b)) D->inexact = 1; /* [] and {} */
    return;
  }
  kind = table_kind(L, a);
  if (kind != table_kind(L, b)) {
    emit(D, "replace", b);
    return;
  }
  /* from here a's table is kept: exact only where b's is marked alike */
  if (D->exact && !same_metatable(L, a, b)) {
    D->inexact = 1;
    return;
  }
  if (++D->depth > COZY_JSON_MAX_DEPTH) too_deep(L, "diff");
  if (kind == 'a') diff_array(D, a, b);
  else diff_object(D, a, b);
  D->depth--;
}

/* json.diff(a, b [, exact]) */
int cozy_json_diff(lua_State *L) {
  Differ D;
  luaL_checkany(L, 1);
  luaL_checkany(L, 2);
  D.exact = lua_toboolean(L, 3);
  D.inexact = 0;
  lua_settop(L, 2);
  D.w = cozy_json_push_scratch(L); /* 3: freed however the call ends */
  lua_newtable(L);
  lua_pushvalue(L, COZY_JSON_ARRAY_MT);
  lua_setmetatable(L, 4);
  D.L = L;
  D.ops = 4;
  D.nops = 0;
  D.depth = 0;
  diff_value(&D, 1, 2);
  if (D.exact && D.inexact) lua_pushnil(L);
  return 1;
}
