/*
** cozy-migrate: the platform migration runner.
** Like lua.c, main only creates the state and runs everything inside one
** protected call (pmain); errors reach one message handler (host.c's, which
** the worker thread's state uses too) and one report path,
** and the exit status is derived from the result.
*/
#include <stdio.h>
#include <stdlib.h>

#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

#include "heap.h"
#include "host.h"
#include "signals.h"

static const char *progname = "cozy-migrate";

/* One fprintf, so the line reaches stderr (unbuffered) as one write and
** cannot interleave with a line from another thread. */
static void l_message(const char *pname, const char *msg) {
  if (pname) fprintf(stderr, "%s: %s\n", pname, msg);
  else fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

/* Prints the error object on top of the stack, if the status is an error. */
static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    if (msg == NULL) msg = "(error object is not a string)";
    l_message(progname, msg);
    lua_pop(L, 1);
  }
  return status;
}

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int status, i;
  luaL_checkversion(L);
  cozy_host_open(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "cozy.cli");
  status = cozy_host_pcall(L, 1, 1);
  if (status != LUA_OK) return lua_error(L);
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 1);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  status = cozy_host_pcall(L, 1, 1);
  if (status != LUA_OK) return lua_error(L);
  /* The exit status cozy.cli.main returned (nil: success), checked here,
  ** inside the protected call: a bad value is an error like any other,
  ** not a panic outside it. */
  if (lua_isnil(L, -1)) {
    lua_pushinteger(L, EXIT_SUCCESS);
  } else {
    int isint;
    lua_Integer code = lua_tointegerx(L, -1, &isint);
    if (!isint || lua_type(L, -1) != LUA_TNUMBER || code < 0 || code > 255) {
      const char *type = luaL_typename(L, -1);
      const char *text = luaL_tolstring(L, -1, NULL);
      return luaL_error(L, "internal error: cozy.cli.main returned %s %s, not an exit status (0-255)", type,
                        text);
    }
    lua_pushinteger(L, code);
  }
  return 1;
}

int main(int argc, char **argv) {
  int status, result;
  lua_State *L;
  cozy_signals_startup(); /* before anything opens a descriptor */
  L = cozy_state_new();
  if (L == NULL) {
    l_message(argv[0], "cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  if (argv[0] && argv[0][0]) progname = argv[0];
  lua_pushcfunction(L, &pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  /* pmain returned an integer in 0..255, or failed: nothing here can raise */
  result = status == LUA_OK ? (int)lua_tointeger(L, -1) : EXIT_FAILURE;
  report(L, status);
  cozy_state_close(L);
  return result;
}
