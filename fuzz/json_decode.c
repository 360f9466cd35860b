/*
** libFuzzer target: cozy.json's decoder (core/json.c) on arbitrary bytes.
** Whatever the input, decode returns or raises a Lua error; never a crash,
** a sanitizer report or a leak. When it returns, the value must survive the
** round trip the engine relies on: if encode accepts it, the text decodes
** again and encodes to the same text (a canonical form is a fixed point).
** The same input is decoded with a projection too (json.decode(s, proj)):
** it raises whenever the full decode raises, and otherwise raises only the
** projection's own refusal (an array met by a table without "*"); what it
** builds encodes. json.copy and json.diff (core/json_value.c) run on what
** decode built: the copy encodes to the same text and differs in nothing,
** and the difference between the full and the projected value is ops that
** encode.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

int luaopen_cozy_json(lua_State *L);

/* A fresh state per input, closed after it: memory that outlives an input
** is then a leak LeakSanitizer reports, not state a persistent Lua keeps. */
static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  if (L == NULL) abort();
  /* no standard library: cozy.json needs none, and opening them costs most of a run */
  luaL_requiref(L, "cozy.json", luaopen_cozy_json, 0);
  lua_setfield(L, LUA_REGISTRYINDEX, "fuzz.json");
  /* a projection with every kind of node: kept whole, descended into,
  ** "*" for arrays and for the keys of an object not named */
  if (luaL_loadstring(L,
                      "return { keep = true, a = { b = true, [\"*\"] = { c = true } },"
                      " [\"*\"] = { [\"*\"] = true }, l = { [\"*\"] = { m = true } } }") != LUA_OK ||
      lua_pcall(L, 0, 1, 0) != LUA_OK)
    abort();
  lua_setfield(L, LUA_REGISTRYINDEX, "fuzz.projection");
  return L;
}

/* json[fn](value at idx [, the projection]) protected; 1 with the result
** pushed, 0 on error (its message kept in *err when err is not NULL). */
static int call_with(lua_State *L, const char *fn, int idx, int projected, const char **err) {
  idx = lua_absindex(L, idx);
  lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.json");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_pushvalue(L, idx);
  if (projected) lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.projection");
  if (lua_pcall(L, 1 + projected, 1, 0) != LUA_OK) {
    if (lua_type(L, -1) != LUA_TSTRING) abort(); /* errors are messages */
    if (err) *err = strstr(lua_tostring(L, -1), "projection has no") ? "refused" : "error";
    lua_pop(L, 1);
    return 0;
  }
  return 1;
}

static int call(lua_State *L, const char *fn, int idx) {
  return call_with(L, fn, idx, 0, NULL);
}

/* json[fn](value at a, value at b) protected: 1 with the result pushed. */
static int call2(lua_State *L, const char *fn, int a, int b) {
  a = lua_absindex(L, a);
  b = lua_absindex(L, b);
  lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.json");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_pushvalue(L, a);
  lua_pushvalue(L, b);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
    if (lua_type(L, -1) != LUA_TSTRING) abort(); /* errors are messages */
    lua_pop(L, 1);
    return 0;
  }
  return 1;
}

/* The projected decode of the input at index 1, against the full one (at
** the top when full_ok). */
static void check_projected(lua_State *L, int full_ok) {
  const char *err = NULL;
  int top = lua_gettop(L);
  if (call_with(L, "decode", 1, 1, &err)) {
    if (!full_ok) abort(); /* it accepted malformed input */
    if (!call(L, "encode", -1)) abort(); /* what it built encodes */
    lua_pop(L, 1);
    /* the ops from the full value to the projected one encode */
    if (!call2(L, "diff", top, -1) || !call(L, "encode", -1)) abort();
  } else if (full_ok && strcmp(err, "refused") != 0) {
    abort(); /* it refused valid JSON for another reason */
  }
  lua_settop(L, top);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L = new_state();
  lua_pushlstring(L, (const char *)data, size); /* 1 */
  check_projected(L, call(L, "decode", 1));
  lua_settop(L, 1);
  if (call(L, "decode", 1) && call(L, "encode", 2)) { /* 2: value, 3: text */
    size_t n1, n2;
    const char *s1, *s2;
    if (!call(L, "decode", 3)) abort(); /* what encode wrote must decode */
    if (!call(L, "encode", 4)) abort(); /* and encode again */
    s1 = lua_tolstring(L, 3, &n1);
    s2 = lua_tolstring(L, 5, &n2);
    if (n1 != n2 || memcmp(s1, s2, n1) != 0) abort(); /* to the same text */
    if (!call(L, "copy", 2) || !call(L, "encode", 6)) abort(); /* 6: a copy, 7: its text */
    s2 = lua_tolstring(L, 7, &n2);
    if (n1 != n2 || memcmp(s1, s2, n1) != 0) abort(); /* encodes as the original */
    if (!call2(L, "diff", 2, 6) || lua_rawlen(L, -1) != 0) abort(); /* and differs in nothing */
  }
  lua_close(L);
  return 0;
}
