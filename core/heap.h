/* The Lua states of the engine: their memory from a heap of their own
** (core/heap.c). */
#ifndef COZY_HEAP_H
#define COZY_HEAP_H

#include "lua.h"

/* A new Lua state as luaL_newstate makes one (a panic function that
** prints the error, warnings off), its allocator a heap of its own; NULL
** when out of memory. Closed with cozy_state_close, never lua_close. */
lua_State *cozy_state_new(void);

/* lua_close, then the state's heap freed. */
void cozy_state_close(lua_State *L);

#endif
