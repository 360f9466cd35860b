/*
** cozy-luac CHUNKNAME SOURCE OUTPUT: compiles one Lua file to a binary chunk
** at build time, for cmake/embed.cmake to put into the binary, so that the
** engine does not parse its own runtime on every start (parsing was most of
** `list`'s time; loading a binary chunk is about ten times cheaper).
**
** Not Debian's luac5.4: this tool links the very Lua the binary links
** (vendor_lua), so the chunk's format (version, sizes of integers, numbers and
** instructions) is the binary's; and it names the chunk as the binary did
** when it compiled the text ("@scripts/cozy/cli.lua"), wherever the source
** lies on disk. Debug information is kept (lua_dump's strip = 0): error
** messages and tracebacks still read scripts/cozy/cli.lua:LINE.
**
** The source is read as text only ("t"): bytecode never enters the binary
** except as compiled here from a source file of the tree.
*/
#include <stdio.h>
#include <stdlib.h>

#include "lua.h"
#include "lauxlib.h"

/* Reads the whole file into a malloc'd buffer; NULL on error (errno set). */
static char *read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t len = 0, cap = 0;
  if (f == NULL) return NULL;
  for (;;) {
    size_t n;
    if (len == cap) {
      char *grown = realloc(buf, cap ? cap * 2 : 65536);
      if (grown == NULL) break;
      buf = grown;
      cap = cap ? cap * 2 : 65536;
    }
    n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) {
      if (ferror(f) || !feof(f)) break;
      fclose(f);
      *size = len;
      return buf;
    }
  }
  free(buf);
  fclose(f);
  return NULL;
}

static int writer(lua_State *L, const void *p, size_t size, void *ud) {
  (void)L;
  return fwrite(p, 1, size, (FILE *)ud) == size ? 0 : 1;
}

int main(int argc, char **argv) {
  lua_State *L;
  FILE *out;
  char *text;
  size_t size = 0;
  int failed;
  if (argc != 4) {
    fprintf(stderr, "usage: cozy-luac CHUNKNAME SOURCE OUTPUT\n");
    return 2;
  }
  text = read_all(argv[2], &size);
  if (text == NULL) {
    perror(argv[2]);
    return 1;
  }
  L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "cozy-luac: cannot create a Lua state\n");
    free(text);
    return 1;
  }
  if (luaL_loadbufferx(L, text, size, argv[1], "t") != LUA_OK) {
    fprintf(stderr, "cozy-luac: %s\n", lua_tostring(L, -1));
    lua_close(L);
    free(text);
    return 1;
  }
  free(text);
  out = fopen(argv[3], "wb");
  if (out == NULL) {
    perror(argv[3]);
    lua_close(L);
    return 1;
  }
  failed = lua_dump(L, writer, out, 0) != 0;
  failed = ferror(out) || failed;
  failed = fclose(out) != 0 || failed;
  lua_close(L);
  if (failed) {
    fprintf(stderr, "cozy-luac: cannot write %s\n", argv[3]);
    remove(argv[3]);
    return 1;
  }
  return 0;
}
