/*
** Sets up the engine's Lua state: the standard libraries, the C modules and
** the runtime compiled from scripts/, all reached through package.preload
** (as Neovim does), so nothing is a global. Debian's Lua paths stay in
** package.path/cpath, so Lua C modules (busted's) load against the exported
** Lua API of this executable. The compiled-in files are core/embedded.c's.
*/
#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

#include "embedded.h"
#include "host.h"
#include "watch.h"

extern const luaL_Reg cozy_c_modules[];

/* The message handler: tostring of non-string errors (structured API errors
** carry a __tostring), plus a traceback. */
static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int cozy_host_pcall(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs; /* the function's index */
  int status;
  lua_pushcfunction(L, msghandler); /* a light C function: pushing it cannot raise */
  lua_insert(L, base);
  status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  return status;
}

void cozy_host_open(lua_State *L) {
  const luaL_Reg *m;
  luaL_openlibs(L);
  cozy_watch_cover_coroutines(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (m = cozy_c_modules; m->name != NULL; m++) {
    lua_pushcfunction(L, m->func);
    lua_setfield(L, -2, m->name);
  }
  cozy_embedded_preload(L);
  lua_pop(L, 1);
}
