/* The engine's C modules, registered in package.preload by host.c. */
#include "lauxlib.h"

#include "host.h"

const luaL_Reg cozy_c_modules[] = {{"cozy.json", luaopen_cozy_json},
                                   {"cozy.yaml_emitter", luaopen_cozy_yaml_emitter},
                                   {"cozy.line_diff", luaopen_cozy_line_diff},
                                   {"cozy.sys", luaopen_cozy_sys},
                                   {"cozy.proc", luaopen_cozy_proc},
                                   {"cozy.worker", luaopen_cozy_worker},
                                   {"cozy.transport", luaopen_cozy_transport},
                                   {"cozy.endpoint", luaopen_cozy_endpoint},
                                   /* raw lua-cjson, so that test helpers written independently of the engine
  ** (spec/support) find it inside the host without loading a second copy */
                                   {"cjson", luaopen_cjson},
                                   {NULL, NULL}};
