/*
** cozy.json's projections (json.h): json.decode's second argument checked
** (check_projection) and compiled into CozyJsonProj nodes
** (compile_projection), which core/json.c's decoding walk follows.
*/
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "json.h"

/* The projection `true`: the whole value is built. */
const CozyJsonProj cozy_json_keep = {NULL, 0, NULL};

/* While compiling, the mark of a key whose value is `false` (its sub is
** NULL once compiled: left out), told apart from a table still waiting. */
static const CozyJsonProj cozy_json_skip = {NULL, 0, NULL};

static int compare_keys(const void *a, const void *b) {
  const CozyJsonProjKey *x = a, *y = b;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return memcmp(x->name, y->name, x->len);
}

/* Room for the compiled projection, as check_projection counted it: one
** node per table it visited, one key per entry. */
typedef struct ProjSpace {
  size_t nodes, keys; /* counted */
  CozyJsonProj *node; /* the next free ones */
  CozyJsonProjKey *key;
} ProjSpace;

/* Compiles the projection table at idx (checked) into the next node of
** space, and its table entries into the nodes after it. A node's keys must
** be contiguous, so the tables of its entries wait on the Lua stack until
** all its keys are written, and are compiled after. The names point into
** the projection's key strings, which argument 2 holds until decode
** returns; a table reached twice is compiled twice, as check_projection
** visits it twice. */
static const CozyJsonProj *compile_projection(lua_State *L, int idx, ProjSpace *space) {
  CozyJsonProj *node = space->node++;
  CozyJsonProjKey *keys = space->key;
  int top = lua_gettop(L), waiting = top;
  size_t i, n = 0;
  luaL_checkstack(L, 3, "cozy.json: projection");
  for (lua_pushnil(L); lua_next(L, idx); n++) {
    keys[n].name = lua_tolstring(L, -2, &keys[n].len); /* a string key: no conversion */
    if (lua_type(L, -1) == LUA_TTABLE) {
      keys[n].sub = NULL; /* its table waits below the key */
      lua_insert(L, -2);
      luaL_checkstack(L, 3, "cozy.json: projection");
    } else {
      keys[n].sub = lua_toboolean(L, -1) ? COZY_JSON_KEEP : &cozy_json_skip;
      lua_pop(L, 1);
    }
  }
  space->key += n;
  for (i = 0; i < n; i++)
    if (!keys[i].sub) keys[i].sub = compile_projection(L, ++waiting, space);
    else if (keys[i].sub == &cozy_json_skip) keys[i].sub = NULL; /* false: left out */
  lua_settop(L, top);
  node->star = NULL;
  for (i = 0; i < n; i++) {
    if (keys[i].len == 1 && keys[i].name[0] == '*') {
      node->star = keys[i].sub;
      keys[i] = keys[--n];
      break;
    }
  }
  qsort(keys, n, sizeof(CozyJsonProjKey), compare_keys);
  node->keys = keys;
  node->nkeys = n;
  return node;
}

/* Checks the projection at idx (a table) before any byte is decoded: keys
** are strings, values true, false (left out: in an object with "*", all
** but these keys) or tables, nesting at most COZY_JSON_MAX_DEPTH
** (which also stops a cycle). On a fault, returns what is wrong and leaves
** the path of the offending entry (e.g. "items.*.spec") on the stack. */
static const char *check_projection(lua_State *L, int idx, int depth, ProjSpace *space) {
  luaL_checkstack(L, 4, "cozy.json: projection");
  if (depth > COZY_JSON_MAX_DEPTH) {
    lua_pushliteral(L, "...");
    return "nested deeper than " COZY_JSON_STR(COZY_JSON_MAX_DEPTH);
  }
  space->nodes++;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int key = lua_gettop(L) - 1, t = lua_type(L, -1);
    const char *fault = NULL;
    space->keys++;
    if (lua_type(L, key) != LUA_TSTRING) {
      lua_pushfstring(L, "[%s]", luaL_typename(L, key));
      lua_replace(L, key);
      lua_settop(L, key); /* the path stays, nothing else piles up */
      return "a key that is not a string";
    }
    if (t == LUA_TTABLE) {
      fault = check_projection(L, key + 1, depth + 1, space);
      if (fault) {
        lua_pushfstring(L, "%s.%s", lua_tostring(L, key), lua_tostring(L, -1));
        lua_replace(L, key);
        lua_settop(L, key);
        return fault;
      }
    } else if (t != LUA_TBOOLEAN) {
      lua_settop(L, key);
      return "not true, false or a table";
    }
    lua_pop(L, 1);
  }
  return NULL;
}

const CozyJsonProj *cozy_json_projection(lua_State *L, int idx) {
  ProjSpace space = {0, 0, NULL, NULL};
  const char *fault;
  int t = lua_type(L, idx);
  if (t == LUA_TNONE || t == LUA_TNIL || (t == LUA_TBOOLEAN && lua_toboolean(L, idx))) return COZY_JSON_KEEP;
  if (t != LUA_TTABLE) return luaL_typeerror(L, idx, "projection table or true"), COZY_JSON_KEEP;
  lua_settop(L, idx);
  fault = check_projection(L, idx, 1, &space);
  if (fault) luaL_argerror(L, idx, lua_pushfstring(L, "projection: %s is %s", lua_tostring(L, -1), fault));
  /* above it: the compiled projection, until decode returns; the nodes and
  ** keys hold pointers and sizes, so the keys after the nodes are aligned */
  space.node =
      lua_newuserdatauv(L, space.nodes * sizeof(CozyJsonProj) + space.keys * sizeof(CozyJsonProjKey), 0);
  space.key = (CozyJsonProjKey *)(space.node + space.nodes);
  return compile_projection(L, idx, &space);
}
