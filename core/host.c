/*
** Sets up the engine's Lua state: the standard libraries, the C modules and
** the runtime compiled from scripts/, all reached through package.preload
** (as Neovim does), so nothing is a global. Debian's Lua paths stay in
** package.path/cpath, so Lua C modules (busted's) load against the exported
** Lua API of this executable.
**
** Development switch: with COZY_MIGRATE_SCRIPTS=DIR set, a runtime module is
** read from DIR (the scripts/ folder of a source tree) instead of the copy
** compiled in, so edits need no rebuild.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

#include "embedded.h"
#include "host.h"
#include "watch.h"

extern const luaL_Reg cozy_c_modules[];

/* Pushes the function of an embedded entry's binary chunk, compiled at build
** time from the tree's file (cmake/luac.c, debug information kept, so messages
** still name path:LINE), or an error message; returns the load status. Mode
** "b", and only here, for bytes that are part of this binary: everything read
** at run time is loaded as text. */
int cozy_load_embedded_chunk(lua_State *L, const struct cozy_embedded *e) {
  const char *chunkname = lua_pushfstring(L, "@%s", e->path);
  int status = luaL_loadbufferx(L, (const char *)e->chunk, e->chunk_size, chunkname, "b");
  lua_remove(L, -2); /* the chunk name */
  return status;
}

/* Loader for one embedded runtime module; upvalue 1 is its index. */
static int load_embedded(lua_State *L) {
  const struct cozy_embedded *e = &cozy_embedded_scripts[lua_tointeger(L, lua_upvalueindex(1))];
  const char *dir = getenv(COZY_MIGRATE_SCRIPTS_ENV);
  int status;
  if (dir != NULL && *dir != '\0') {
    /* e->path is "scripts/<rel>"; read <dir>/<rel> */
    const char *rel = strchr(e->path, '/');
    const char *file = lua_pushfstring(L, "%s%s", dir, rel ? rel : e->path);
    status = luaL_loadfilex(L, file, "t");
  } else {
    status = cozy_load_embedded_chunk(L, e);
  }
  if (status != LUA_OK) return luaL_error(L, "error loading module '%s': %s", e->name, lua_tostring(L, -1));
  lua_pushstring(L, e->name);
  lua_call(L, 1, 1);
  return 1;
}

void cozy_host_open(lua_State *L) {
  const luaL_Reg *m;
  int i;
  luaL_openlibs(L);
  cozy_watch_cover_coroutines(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (m = cozy_c_modules; m->name != NULL; m++) {
    lua_pushcfunction(L, m->func);
    lua_setfield(L, -2, m->name);
  }
  for (i = 0; cozy_embedded_scripts[i].name != NULL; i++) {
    lua_pushinteger(L, i);
    lua_pushcclosure(L, load_embedded, 1);
    lua_setfield(L, -2, cozy_embedded_scripts[i].name);
  }
  lua_pop(L, 1);
}
