/*
** cozy.line_diff: scripts/cozy/diff.lua's unified diff in C, for the end of
** a plan, which diffs both sides of every object it changed (its Lua was a
** sixth of the plan's, bench/README.md).
**
** unified(a, b, from, to, context, max_edits) returns what diff.lua's
** unified_lua(a, b, from, to, context) returns with diff.MAX_EDITS =
** max_edits: the same edit script (the common head and tail set aside,
** Myers' shortest script in between with the same choice among equally
** short ones, each run of changes with its removed lines first, all
** removed then all added past max_edits), the same hunks and headers. It
** returns nil, and leaves the diff to diff.lua, where an argument is not
** what the plan passes: a line that is not a string, a label that is
** neither a string nor a number, a context or max_edits that is not a
** non-negative integer. spec/unit/line_diff_spec.lua compares the two.
**
** Memory: the lines are read in place (the arrays must not change during
** the call); Myers' snapshots of each round and the line being built live
** in to-be-closed scratches, freed when unified returns or raises.
*/
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "host.h"
#include "json.h"

/* a value of Myers' v that the Lua table does not hold (nil) */
#define UNSET LONG_MIN

typedef struct Line {
  const char *s;
  size_t len;
} Line;

/* One op of the edit script: ' ', '-' or '+', the line's index in a (' ',
** '-') or b ('+'), from 0, and its line numbers in a and b, from 1. */
typedef struct Op {
  char op;
  long line;
  long na, nb;
} Op;

typedef struct Diff {
  lua_State *L;
  const Line *a, *b; /* the middle parts of a and b */
  long n, m;
  CozyJsonScratch *trace; /* Myers' snapshots, as longs */
  Op *ops; /* the middle's edit script */
  long nops;
} Diff;

static int line_eq(const Line *x, const Line *y) {
  return x->len == y->len && (x->s == y->s || memcmp(x->s, y->s, x->len) == 0);
}

/* The lines of the array at idx in a new userdata (pushed), or NULL when one
** is not a string. */
static Line *read_lines(lua_State *L, int idx, long *count) {
  long n = (long)lua_rawlen(L, idx), i;
  Line *lines = (Line *)lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *lines, 0);
  for (i = 0; i < n; i++) {
    if (lua_rawgeti(L, idx, i + 1) != LUA_TSTRING) {
      lua_pop(L, 1);
      return NULL;
    }
    lines[i].s = lua_tolstring(L, -1, &lines[i].len);
    lua_pop(L, 1); /* still held by the array */
  }
  *count = n;
  return lines;
}

/* Myers' v or a snapshot of it: k from -d - 1 to d + 1 at base[k + d + 1] */
static long *snapshot(Diff *df, size_t at) {
  return (long *)(void *)df->trace->buf + at;
}

static long or_else(long v, long dflt) {
  return v == UNSET ? dflt : v;
}

/* diff.lua's myers on df->a, df->b: the ops in df->ops, 1; 0 when the
** script would be longer than max_d. */
static int myers(Diff *df, long max_d) {
  lua_State *L = df->L;
  long n = df->n, m = df->m, d, k, limit = n + m < max_d ? n + m : max_d;
  /* v: k from -limit - 1 to limit + 1 */
  long vsize = 2 * limit + 3, *v, x, y;
  size_t at = 0; /* where the snapshot of round d starts: sum of 2i + 3 for i < d */
  cozy_json_text_room(L, df->trace, (size_t)vsize * sizeof(long));
  df->trace->len = (size_t)vsize * sizeof(long);
  for (k = 0; k < vsize; k++) snapshot(df, 0)[k] = UNSET;
  snapshot(df, 0)[1 + limit + 1] = 0; /* v[1] = 0 */
  for (d = 0; d <= limit; d++) {
    long width = 2 * d + 3, j;
    at = df->trace->len / sizeof(long);
    cozy_json_text_room(L, df->trace, (size_t)width * sizeof(long));
    df->trace->len += (size_t)width * sizeof(long);
    v = snapshot(df, 0) + limit + 1;
    for (j = 0; j < width; j++) snapshot(df, at)[j] = v[j - d - 1];
    for (k = -d; k <= d; k += 2) {
      if (k == -d || (k != d && or_else(v[k - 1], -1) < or_else(v[k + 1], -1))) x = or_else(v[k + 1], 0);
      else x = or_else(v[k - 1], 0) + 1;
      y = x - k;
      while (x < n && y < m && line_eq(&df->a[x], &df->b[y])) x++, y++;
      v[k] = x;
      if (x >= n && y >= m) {
        /* walk back from (n, m) through the snapshots, ops in reverse */
        long cx = n, cy = m, dd, count = 0, i;
        size_t sat = at;
        df->ops = (Op *)lua_newuserdatauv(L, (size_t)(n + m + 1) * sizeof(Op), 0);
        for (dd = d; dd >= 1; dd--) {
          const long *pv = snapshot(df, sat) + dd + 1;
          long kk = cx - cy, pk, px, py;
          if (kk == -dd || (kk != dd && or_else(pv[kk - 1], -1) < or_else(pv[kk + 1], -1))) pk = kk + 1;
          else pk = kk - 1;
          px = or_else(pv[pk], 0);
          py = px - pk;
          while (cx > px && cy > py) {
            df->ops[count++] = (Op){' ', cx - 1, 0, 0};
            cx--, cy--;
          }
          if (cx == px) df->ops[count++] = (Op){'+', cy - 1, 0, 0};
          else df->ops[count++] = (Op){'-', cx - 1, 0, 0};
          cx = px, cy = py;
          sat -= (size_t)(2 * (dd - 1) + 3);
        }
        while (cx > 0 && cy > 0) {
          df->ops[count++] = (Op){' ', cx - 1, 0, 0};
          cx--, cy--;
        }
        for (i = 0; i < count / 2; i++) {
          Op t = df->ops[i];
          df->ops[i] = df->ops[count - 1 - i];
          df->ops[count - 1 - i] = t;
        }
        df->nops = count;
        return 1;
      }
    }
  }
  return 0;
}

/* "@@ -l,s +l,s @@"'s ranges as diff writes them */
static size_t range(char *out, size_t size, long start, long count) {
  if (count == 1) return (size_t)snprintf(out, size, "%ld", start);
  if (count == 0) return (size_t)snprintf(out, size, "%ld,0", start - 1);
  return (size_t)snprintf(out, size, "%ld,%ld", start, count);
}

static void push_joined(lua_State *L, CozyJsonScratch *buf, const char *p, size_t plen, const char *s,
                        size_t len) {
  buf->len = 0;
  cozy_json_text_room(L, buf, plen + len + 1);
  memcpy(buf->buf, p, plen);
  memcpy(buf->buf + plen, s, len);
  lua_pushlstring(L, buf->buf, plen + len);
}

/* The i-th op of the whole script (head, middle, tail; from 1): diff.lua's
** op_at. */
static void script_at(const Diff *df, const Line *a, long n, long m, long head, long tail, long i, char *op,
                      const Line **line, long *oa, long *ob) {
  long nm = df->nops;
  if (i <= head) {
    *op = ' ', *line = &a[i - 1], *oa = i, *ob = i;
  } else if (i <= head + nm) {
    const Op *o = &df->ops[i - head - 1];
    *op = o->op, *oa = o->na, *ob = o->nb;
    *line = o->op == '+' ? &df->b[o->line] : &df->a[o->line];
  } else {
    long j = i - head - nm;
    *op = ' ', *line = &a[n - tail + j - 1], *oa = n - tail + j, *ob = m - tail + j;
  }
}

/* unified(a, b, from, to, context, max_edits) */
static int line_diff_unified(lua_State *L) {
  Diff df;
  Line *a, *b;
  long n, m, head = 0, tail = 0, nm, total, *changes, nchanges = 0, i, c, out_n = 0;
  lua_Integer context, max_edits;
  size_t flen, tlen;
  const char *from, *to;
  CozyJsonScratch *text;
  int isnum1, isnum2;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  context = lua_tointegerx(L, 5, &isnum1);
  max_edits = lua_tointegerx(L, 6, &isnum2);
  /* (a float context would print its line numbers as floats in Lua) */
  if (!isnum1 || !isnum2 || !lua_isinteger(L, 5) || context < 0 || max_edits < 0 || context > LONG_MAX / 4 ||
      (lua_type(L, 3) != LUA_TSTRING && lua_type(L, 3) != LUA_TNUMBER) ||
      (lua_type(L, 4) != LUA_TSTRING && lua_type(L, 4) != LUA_TNUMBER))
    return 0;
  lua_settop(L, 6);
  from = lua_tolstring(L, 3, &flen);
  to = lua_tolstring(L, 4, &tlen);
  a = read_lines(L, 1, &n);
  if (a == NULL) return 0;
  b = read_lines(L, 2, &m);
  if (b == NULL) return 0;
  while (head < n && head < m && line_eq(&a[head], &b[head])) head++;
  while (tail < n - head && tail < m - head && line_eq(&a[n - 1 - tail], &b[m - 1 - tail])) tail++;
  df.L = L;
  df.a = a + head;
  df.b = b + head;
  df.n = n - head - tail;
  df.m = m - head - tail;
  df.trace = cozy_json_push_scratch(L);
  text = cozy_json_push_scratch(L);
  df.ops = NULL;
  df.nops = 0;
  if (!myers(&df, (long)(max_edits < LONG_MAX / 4 ? max_edits : LONG_MAX / 4))) {
    df.ops = (Op *)lua_newuserdatauv(L, (size_t)(df.n + df.m + 1) * sizeof(Op), 0);
    for (i = 0; i < df.n; i++) df.ops[df.nops++] = (Op){'-', i, 0, 0};
    for (i = 0; i < df.m; i++) df.ops[df.nops++] = (Op){'+', i, 0, 0};
  }
  /* in each run of changes, what goes before what comes: a stable partition */
  {
    Op *sorted = (Op *)lua_newuserdatauv(L, (size_t)(df.nops + 1) * sizeof(Op), 0);
    long at = 0, j, x;
    i = 0;
    while (i < df.nops) {
      if (df.ops[i].op == ' ') {
        sorted[at++] = df.ops[i++];
        continue;
      }
      for (j = i; j < df.nops && df.ops[j].op != ' '; j++) {}
      for (x = i; x < j; x++)
        if (df.ops[x].op == '-') sorted[at++] = df.ops[x];
      for (x = i; x < j; x++)
        if (df.ops[x].op == '+') sorted[at++] = df.ops[x];
      i = j;
    }
    df.ops = sorted;
  }
  nm = df.nops;
  changes = (long *)lua_newuserdatauv(L, (size_t)(nm + 1) * sizeof(long), 0);
  {
    long ai = head + 1, bi = ai;
    for (i = 0; i < nm; i++) {
      Op *o = &df.ops[i];
      o->na = ai;
      o->nb = bi;
      if (o->op != '+') ai++;
      if (o->op != '-') bi++;
      if (o->op != ' ') changes[nchanges++] = head + i + 1;
    }
  }
  lua_newtable(L);
  if (nchanges == 0) return 1;
  total = head + nm + tail;
  push_joined(L, text, "--- ", 4, from, flen);
  lua_rawseti(L, -2, ++out_n);
  push_joined(L, text, "+++ ", 4, to, tlen);
  lua_rawseti(L, -2, ++out_n);
  for (c = 0; c < nchanges; c++) {
    long first = changes[c] - context > 1 ? changes[c] - context : 1, last_change = changes[c], last;
    long a_start = 0, a_count = 0, b_start = 0, b_count = 0;
    char hunk[128];
    size_t hlen;
    while (c + 1 < nchanges && changes[c + 1] - last_change <= 2 * context + 1) last_change = changes[++c];
    last = last_change + context < total ? last_change + context : total;
    /* the header first, with the counts of the body */
    for (i = first; i <= last; i++) {
      char op;
      const Line *line;
      long oa, ob;
      script_at(&df, a, n, m, head, tail, i, &op, &line, &oa, &ob);
      if (op != '+') {
        if (a_start == 0) a_start = oa;
        a_count++;
      }
      if (op != '-') {
        if (b_start == 0) b_start = ob;
        b_count++;
      }
    }
    if (a_start == 0 || b_start == 0) {
      /* an empty side starts at the first line's numbers */
      char op;
      const Line *line;
      long fa, fb;
      script_at(&df, a, n, m, head, tail, first, &op, &line, &fa, &fb);
      if (a_start == 0) a_start = fa;
      if (b_start == 0) b_start = fb;
    }
    memcpy(hunk, "@@ -", 4);
    hlen = 4 + range(hunk + 4, sizeof hunk - 4, a_start, a_count);
    memcpy(hunk + hlen, " +", 2);
    hlen += 2;
    hlen += range(hunk + hlen, sizeof hunk - hlen, b_start, b_count);
    memcpy(hunk + hlen, " @@", 3);
    hlen += 3;
    lua_pushlstring(L, hunk, hlen);
    lua_rawseti(L, -2, ++out_n);
    for (i = first; i <= last; i++) {
      char op;
      const Line *line;
      long oa, ob;
      script_at(&df, a, n, m, head, tail, i, &op, &line, &oa, &ob);
      push_joined(L, text, &op, 1, line->s, line->len);
      lua_rawseti(L, -2, ++out_n);
    }
  }
  return 1;
}

int luaopen_cozy_line_diff(lua_State *L) {
  static const luaL_Reg funcs[] = {{"unified", line_diff_unified}, {NULL, NULL}};
  luaL_newlib(L, funcs);
  return 1;
}
