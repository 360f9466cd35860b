/* cozy.transport: placeholder until the libcurl transport lands. */
#include "lua.h"
#include "lauxlib.h"

#include "host.h"

int luaopen_cozy_transport(lua_State *L) {
  lua_newtable(L);
  return 1;
}
