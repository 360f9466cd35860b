/*
** cozy-migrate: the platform migration runner.
** Like lua.c, main only creates the state and runs everything inside one
** protected call (pmain); errors reach one message handler and one report path,
** and the exit status is derived from the result.
*/
#include <stdio.h>
#include <stdlib.h>

#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

#include "host.h"

static const char *progname = "cozy-migrate";

static void l_message(const char *pname, const char *msg) {
  if (pname) fprintf(stderr, "%s: ", pname);
  fprintf(stderr, "%s\n", msg);
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

/* The one message handler: tostring of non-string errors (structured API
** errors carry a __tostring), plus a traceback. */
static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int status, i;
  luaL_checkversion(L);
  cozy_host_open(L);
  lua_pushcfunction(L, msghandler);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "cozy.cli");
  status = lua_pcall(L, 1, 1, 3);
  if (status != LUA_OK) return lua_error(L);
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 1);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  status = lua_pcall(L, 1, 1, 3);
  if (status != LUA_OK) return lua_error(L);
  return 1; /* the exit status cozy.cli.main returned */
}

int main(int argc, char **argv) {
  int status, result;
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    l_message(argv[0], "cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  if (argv[0] && argv[0][0]) progname = argv[0];
  lua_pushcfunction(L, &pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  result = status == LUA_OK ? (int)luaL_optinteger(L, -1, EXIT_SUCCESS) : EXIT_FAILURE;
  report(L, status);
  lua_close(L);
  return result;
}
