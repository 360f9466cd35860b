/*
** libFuzzer target: cozy.json's decoder (core/json.c) on arbitrary bytes.
** Whatever the input, decode returns or raises a Lua error; never a crash,
** a sanitizer report or a leak. When it returns, the value must survive the
** round trip the engine relies on: if encode accepts it, the text decodes
** again and encodes to the same text (a canonical form is a fixed point).
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
  return L;
}

/* json[fn](value at idx) protected; 1 with the result pushed, 0 on error. */
static int call(lua_State *L, const char *fn, int idx) {
  idx = lua_absindex(L, idx);
  lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.json");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_pushvalue(L, idx);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    if (lua_type(L, -1) != LUA_TSTRING) abort(); /* errors are messages */
    lua_pop(L, 1);
    return 0;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L = new_state();
  lua_pushlstring(L, (const char *)data, size); /* 1 */
  if (call(L, "decode", 1) && call(L, "encode", 2)) { /* 2: value, 3: text */
    size_t n1, n2;
    const char *s1, *s2;
    if (!call(L, "decode", 3)) abort(); /* what encode wrote must decode */
    if (!call(L, "encode", 4)) abort();  /* and encode again */
    s1 = lua_tolstring(L, 3, &n1);
    s2 = lua_tolstring(L, 5, &n2);
    if (n1 != n2 || memcmp(s1, s2, n1) != 0) abort(); /* to the same text */
  }
  lua_close(L);
  return 0;
}
