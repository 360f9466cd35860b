/* The Lua state as the engine sets it up: libraries, C modules and the
** compiled-in runtime, all reached through package.preload. */
#ifndef COZY_HOST_H
#define COZY_HOST_H

#include "lua.h"

#define COZY_MIGRATE_SCRIPTS_ENV "COZY_MIGRATE_SCRIPTS"

void cozy_host_open(lua_State *L);

/* lua_pcall(L, nargs, nresults) under the one message handler of the main
** state and the worker thread's alike: an error comes back as its string
** (tostring through __tostring for a structured error) with a traceback. */
int cozy_host_pcall(lua_State *L, int nargs, int nresults);

/* C modules of the engine (core/modules.c). */
int luaopen_cozy_json(lua_State *L);
int luaopen_cozy_yaml_emitter(lua_State *L); /* core/yaml_emit.c */
int luaopen_cozy_line_diff(lua_State *L); /* core/line_diff.c */
int luaopen_cozy_sys(lua_State *L);
int luaopen_cozy_proc(lua_State *L); /* core/proc.c */
int luaopen_cozy_endpoint(lua_State *L); /* core/endpoint.c */
int luaopen_cozy_worker(lua_State *L); /* core/worker.c */
int luaopen_cozy_transport(lua_State *L);
int luaopen_cjson(lua_State *L);

#endif
