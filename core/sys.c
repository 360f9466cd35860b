/*
** cozy.sys: the few operating-system facilities the runtime needs and Lua's
** standard library lacks. Not reachable from migrations (the sandbox does not
** offer it).
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "lua.h"
#include "lauxlib.h"

#include "clock.h"
#include "embedded.h"
#include "exec_credential.h"
#include "host.h"
#include "watch.h"

#ifndef COZY_MIGRATE_VERSION
#define COZY_MIGRATE_VERSION "0.0.0-dev"
#endif

static int push_errno(lua_State *L, const char *what) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", what, strerror(errno));
  return 2;
}

/* Seconds on a clock that never jumps, for durations and deadlines. */
static int sys_monotime(lua_State *L) {
  lua_pushnumber(L, cozy_monotime());
  return 1;
}

/* Wall-clock time with sub-second precision, for timestamps. */
static int sys_time(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
  return 1;
}

/* Under an armed proc.watch the sleep ends early on a signal or the deadline,
** raising as the watch's hook does. With none armed, a signal this thread
** trapped ends it early without raising: the caller polls proc.signalled(). */
static int sys_sleep(lua_State *L) {
  lua_Number s = luaL_checknumber(L, 1);
  const struct cozy_watches *ws = cozy_watches(L);
  double detail = 0;
  int r;
  luaL_argcheck(L, s >= 0, 1, "negative duration");
  r = cozy_watch_sleep(ws, s, &detail);
  if (r != COZY_GO && ws != NULL && ws->top != NULL) return cozy_watch_raise(L, r, detail, 1);
  return 0;
}

static int sys_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

static int sys_hostname(lua_State *L) {
  char buf[256];
  if (gethostname(buf, sizeof buf) != 0) return push_errno(L, "gethostname");
  buf[sizeof buf - 1] = '\0';
  lua_pushstring(L, buf);
  return 1;
}

static int sys_sha256(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0, i;
  char hex[2 * EVP_MAX_MD_SIZE + 1];
  if (!EVP_Digest(s, len, md, &mdlen, EVP_sha256(), NULL)) return luaL_error(L, "sha256 failed");
  for (i = 0; i < mdlen; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  lua_pushlstring(L, hex, 2 * mdlen);
  return 1;
}

/* sys.write_private(path, data): the file at path holds data, readable by its
** owner only (mode 0600, also when it existed before): a saved plan may name
** what an operator does not share. Not through a symbolic link. true, or nil
** and why. */
static int sys_write_private(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  size_t len, off = 0;
  const char *data = luaL_checklstring(L, 2, &len);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return push_errno(L, path);
  if (fchmod(fd, 0600) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return push_errno(L, path);
  }
  while (off < len) {
    ssize_t n = write(fd, data + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      errno = e;
      return push_errno(L, path);
    }
    off += (size_t)n;
  }
  if (close(fd) != 0) return push_errno(L, path);
  lua_pushboolean(L, 1);
  return 1;
}

/* An open directory owned by a userdata, so a memory error raised while the
** names are pushed cannot leak it: __gc closes what the loop left open. */
#define DIR_MT "cozy.sys.dir"

static int dir_gc(lua_State *L) {
  DIR **box = luaL_checkudata(L, 1, DIR_MT);
  if (*box != NULL) closedir(*box);
  *box = NULL;
  return 0;
}

/* Names in a directory, sorted by the caller if it cares; nil, err on failure. */
static int sys_listdir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  DIR **box = lua_newuserdatauv(L, sizeof *box, 0);
  struct dirent *e;
  int n = 0;
  *box = NULL;
  if (luaL_newmetatable(L, DIR_MT)) {
    lua_pushcfunction(L, dir_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  *box = opendir(path);
  if (*box == NULL) return push_errno(L, path);
  lua_newtable(L);
  errno = 0;
  while ((e = readdir(*box)) != NULL) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      lua_pushstring(L, e->d_name);
      lua_rawseti(L, -2, ++n);
    }
    errno = 0;
  }
  if (errno != 0) return push_errno(L, path); /* a partial listing is not a listing */
  closedir(*box);
  *box = NULL;
  return 1;
}

/* "file", "directory", "other" or nil; second result: executable by us. */
static int sys_stat(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  if (stat(path, &st) != 0) return push_errno(L, path);
  lua_pushstring(L, S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "directory" : "other");
  lua_pushboolean(L, access(path, X_OK) == 0);
  return 2;
}

/* sys.realpath(path) -> the absolute, resolved path, or nil, err. A legacy
** script runs from its own directory: relative paths handed to it
** (KUBECONFIG) are made absolute first. */
static int sys_realpath(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  /* into a buffer the collector owns, not realpath's malloc'd one, which a
  ** memory error raised while the result is pushed would strand */
  char *resolved = lua_newuserdatauv(L, PATH_MAX, 0);
  if (realpath(path, resolved) == NULL) return push_errno(L, path);
  lua_pushstring(L, resolved);
  return 1;
}

/* sys.find_command(name) -> path, or nil, why ("not found" or "relative",
** with the path found through an empty or relative PATH element): the
** exec plugin's lookup (core/exec_credential.c), for a migration's declared
** tools (scripts/cozy/runner/tools.lua). */
static int sys_find_command(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  /* Lua-owned buffers first: a memory error raised while pushing must not
  ** strand the lookup's malloc'd path */
  char *found = lua_newuserdatauv(L, PATH_MAX, 0), *dot = lua_newuserdatauv(L, PATH_MAX, 0), *p;
  dot[0] = '\0';
  p = cozy_find_command(name, dot, PATH_MAX);
  if (p == NULL) {
    int e = errno;
    lua_pushnil(L);
    if (e == EPERM) lua_pushfstring(L, "relative: %s", dot);
    else if (e == ENOENT) lua_pushliteral(L, "not found");
    else lua_pushstring(L, strerror(e));
    return 2;
  }
  if (strlen(p) >= PATH_MAX) {
    free(p);
    lua_pushnil(L);
    lua_pushliteral(L, "path too long");
    return 2;
  }
  memcpy(found, p, strlen(p) + 1);
  free(p);
  lua_pushstring(L, found);
  return 1;
}

/* Byte order of two strings (memcmp, then length): -1, 0 or 1. The API
** server orders list keys this way; Lua's < uses strcoll, which follows the
** locale, and a byte loop in Lua costs more than the rest of a list item. */
static int sys_compare(lua_State *L) {
  size_t la, lb;
  const char *a = luaL_checklstring(L, 1, &la);
  const char *b = luaL_checklstring(L, 2, &lb);
  int c = memcmp(a, b, la < lb ? la : lb);
  if (c == 0) c = (la > lb) - (la < lb);
  lua_pushinteger(L, (c > 0) - (c < 0));
  return 1;
}

/* The number of elements of the array at 1 (up to its first nil) when
** each is a string with no control character (C0 or DEL: Lua's %c), else
** nil. text.lines asks this of every report line before it joins them: a
** plan prints megabytes of lines, and Lua's pattern matcher spends about
** fifty instructions a byte on %c where this loop spends a few. */
static int sys_plain_lines(lua_State *L) {
  lua_Integer n = 0;
  luaL_checktype(L, 1, LUA_TTABLE);
  for (;;) {
    size_t len, i;
    const unsigned char *s;
    int t = lua_rawgeti(L, 1, n + 1);
    if (t == LUA_TNIL) break;
    if (t != LUA_TSTRING) {
      lua_pushnil(L);
      return 1;
    }
    s = (const unsigned char *)lua_tolstring(L, -1, &len);
    for (i = 0; i < len; i++) {
      if (s[i] < 0x20 || s[i] == 0x7f) {
        lua_pushnil(L);
        return 1;
      }
    }
    lua_pop(L, 1);
    n++;
  }
  lua_pushinteger(L, n);
  return 1;
}

static const luaL_Reg sys_funcs[] = {{"monotime", sys_monotime},
                                     {"time", sys_time},
                                     {"sleep", sys_sleep},
                                     {"getpid", sys_getpid},
                                     {"hostname", sys_hostname},
                                     {"sha256", sys_sha256},
                                     {"listdir", sys_listdir},
                                     {"stat", sys_stat},
                                     {"realpath", sys_realpath},
                                     {"find_command", sys_find_command},
                                     {"builtin_migrations", cozy_builtin_migrations},
                                     {"compare", sys_compare},
                                     {"plain_lines", sys_plain_lines},
                                     {"write_private", sys_write_private},
                                     {NULL, NULL}};

int luaopen_cozy_sys(lua_State *L) {
  luaL_newlib(L, sys_funcs);
  lua_pushliteral(L, COZY_MIGRATE_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
