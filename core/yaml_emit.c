/*
** cozy.yaml_emitter: cozy.yaml's emitter in C for what an object mostly
** holds (its mappings and sequences, its keys in go-yaml's order, strings of
** printable ASCII, integers, booleans, nulls), for the end of a plan, where
** the YAML of both sides of every object changed was most of the
** rehearsal's Lua (bench/README.md).
**
** emit(out, v, scalar, key_text, sorted_keys [, memo]) appends to array
** `out` the lines of v (a mapping or a sequence with at least one entry) as
** scripts/cozy/yaml.lua's `emit(out, v, 0, nil, 0)` appends them, and
** returns whether one of them holds a line break. memo (from memo()), kept
** by the caller across calls, remembers the lines of every mapping and
** sequence emitted with it, and a table met again at the same indentation
** is not emitted again (yaml.lines_lua's `seen`): the plan's two sides of
** an object share every subtree its writes left alone, so the before's
** YAML is mostly the after's. The tables must not change while it is in
** use. That module stays the
** definition: the three functions are its own, called here for what this
** file does not decide itself, so the output is the same by construction
** there:
**  - scalar(out, first, value, indent): a string with a byte outside
**    printable ASCII (a line break, a tab, UTF-8) or after a line that has
**    one, a float that is not integral, a value of any type but nil,
**    json.null, a boolean, a number and a string;
**  - key_text(key): any key but a plain one of a letter and then letters,
**    digits and "._/-" (no reserved word, within 80 columns);
**  - sorted_keys(t): a mapping with a key that is not a string, or that
**    holds a digit or a byte above 0x7F. The other keys are sorted here by
**    the order that module gives them (a letter after any other byte, else
**    byte order, a prefix first).
** The ASCII strings follow that module's plain_is_string, analyze and
** writers, line for line (folding at 80 columns included).
** spec/unit/yaml_emitter_spec.lua compares the two emitters on every object
** of migration 59's benchmark fleet and on random documents.
**
** Tables are classified as yaml.lua's kind_of does: json.array_mt is a
** sequence, json.object_mt a mapping, otherwise an empty table a mapping,
** one with a [1] a sequence. Nesting deeper than json.max_depth raises
** "cozy.yaml: a table nested deeper than N levels" (a cycle too).
** The line being built lives in a to-be-closed scratch, freed when emit
** returns or an error (of a callback too) unwinds it; nothing else is
** allocated outside Lua.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "host.h"
#include "json.h"

#define WIDTH 80
#define INDENT 2
#define MAX_SIMPLE_KEY 128

/* Stack slots of emit's arguments. */
#define OUT 1
#define SCALAR 3
#define KEY_TEXT 4
#define SORTED_KEYS 5

#define ARRAY_MT lua_upvalueindex(1)
#define OBJECT_MT lua_upvalueindex(2)

typedef enum { KIND_SCALAR, KIND_SEQ, KIND_MAP } Kind;

/* A memo (emitter.memo()): where the lines of each mapping and sequence
** emitted with it are, so that the same table met again at the same
** indentation is not emitted again. A record per table; its uservalues
** are `seen` (table -> record number: the tables it names stay alive, so
** none can be another table by then) and `outs` (the out arrays of the
** calls that used it, which hold the lines). */
typedef struct MemoRecord {
  lua_Integer first, last; /* its lines: outs[out_no][first .. last] */
  int out_no, indent, depth, has_break;
} MemoRecord;

typedef struct Memo {
  MemoRecord *r;
  size_t n, cap;
} Memo;

#define MEMO_MT "cozy.yaml_emitter.memo"

typedef struct Emitter {
  lua_State *L;
  CozyJsonScratch *line; /* the line being built */
  lua_Integer n; /* #out */
  int has_break; /* a line written by a callback holds a "\n" */
  Memo *memo; /* NULL: none */
  int seen, outs, out_no; /* the memo's uservalues' stack slots; out's number in outs */
} Emitter;

/* yaml.lua's kind_of: the value at idx. */
static Kind kind_of(lua_State *L, int idx) {
  Kind k;
  if (lua_type(L, idx) != LUA_TTABLE) return KIND_SCALAR;
  if (lua_getmetatable(L, idx)) {
    int seq = lua_rawequal(L, -1, ARRAY_MT), map = lua_rawequal(L, -1, OBJECT_MT);
    lua_pop(L, 1);
    if (seq) return KIND_SEQ;
    if (map) return KIND_MAP;
  }
  lua_pushnil(L);
  if (lua_next(L, idx) == 0) return KIND_MAP;
  lua_pop(L, 2);
  k = lua_geti(L, idx, 1) != LUA_TNIL ? KIND_SEQ : KIND_MAP;
  lua_pop(L, 1);
  return k;
}

/* Whether the table at idx has no entry (next(t) == nil). */
static int is_empty(lua_State *L, int idx) {
  lua_pushnil(L);
  if (lua_next(L, idx) == 0) return 1;
  lua_pop(L, 2);
  return 0;
}

/* The words a plain scalar of letters may not be: they read back as a
** boolean or a null (yaml.lua's RESERVED, those of its words that are made
** of letters). */
static const char *const reserved_words[] = {
    "y",  "Y",  "yes", "Yes",   "YES",   "true",  "True", "TRUE", "on",  "On",   "ON",   "n",    "N",
    "no", "No", "NO",  "false", "False", "FALSE", "off",  "Off",  "OFF", "null", "Null", "NULL", NULL};

static int is_reserved(const char *s, size_t len) {
  int i;
  if (len > 5) return 0;
  for (i = 0; reserved_words[i] != NULL; i++)
    if (strlen(reserved_words[i]) == len && memcmp(reserved_words[i], s, len) == 0) return 1;
  return 0;
}

static int is_letter(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

static int is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}

/* yaml.lua's fast plain string: a letter, then letters, digits, ".", "_",
** "/" or "-", and no reserved word. */
static int is_simple_plain(const char *s, size_t len) {
  size_t i;
  if (len == 0 || !is_letter((unsigned char)s[0])) return 0;
  for (i = 1; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!is_letter(c) && !is_digit(c) && c != '.' && c != '_' && c != '/' && c != '-') return 0;
  }
  return !is_reserved(s, len);
}

/* The line: cleared, then appended to. */
static void line_reset(Emitter *e) {
  e->line->len = 0;
}

static void line_add(Emitter *e, const char *s, size_t len) {
  cozy_json_text_room(e->L, e->line, len);
  memcpy(e->line->buf + e->line->len, s, len);
  e->line->len += len;
}

static void line_spaces(Emitter *e, size_t n) {
  cozy_json_text_room(e->L, e->line, n);
  memset(e->line->buf + e->line->len, ' ', n);
  e->line->len += n;
}

/* The line, as the next entry of out. */
static void put_line(Emitter *e) {
  lua_pushlstring(e->L, e->line->buf, e->line->len);
  lua_rawseti(e->L, OUT, ++e->n);
}

/* The lines yaml.lua's function at `fn` appended, counted; those holding a
** line break noted (yaml.lines splits them). Expects fn's arguments after
** fn on the stack. */
static void call_writer(Emitter *e, int nargs) {
  lua_State *L = e->L;
  lua_Integer i, n;
  lua_call(L, nargs, 0);
  n = (lua_Integer)lua_rawlen(L, OUT);
  for (i = e->n + 1; i <= n && !e->has_break; i++) {
    size_t len;
    const char *s;
    lua_rawgeti(L, OUT, i);
    s = lua_tolstring(L, -1, &len);
    if (s != NULL && memchr(s, '\n', len) != NULL) e->has_break = 1;
    lua_pop(L, 1);
  }
  e->n = n;
}

/* The ASCII strings: yaml.lua's plain_is_string, analyze and writers on a
** string of printable ASCII (0x20 - 0x7E), without a line break. Lua's
** patterns of that module are quoted beside their C. */

static int all_digits(const char *s, const char *end) {
  if (s == end) return 0;
  for (; s < end; s++)
    if (!is_digit((unsigned char)*s)) return 0;
  return 1;
}

/* "^(%d%d?)" then a byte `stop` ("%-" or ":"), with Lua's backtracking: the
** number read in *v, the position after `stop` returned, or NULL. */
static const char *one_or_two(const char *p, const char *end, char stop, int *v) {
  if (p < end && is_digit((unsigned char)p[0])) {
    if (p + 2 < end && is_digit((unsigned char)p[1]) && p[2] == stop) {
      *v = (p[0] - '0') * 10 + (p[1] - '0');
      return p + 3;
    }
    if (p + 1 < end && p[1] == stop) {
      *v = p[0] - '0';
      return p + 2;
    }
  }
  return NULL;
}

/* is_timestamp: one of go-yaml's timestamp forms, YYYY-M-D, then an
** optional time */
static int is_timestamp(const char *s, const char *end) {
  const char *p = s + 5, *zone;
  int m, d, hh, mm, ss;
  char sep;
  /* "^(%d%d%d%d)%-(.*)$" */
  if (end - s < 5 || !all_digits(s, s + 4) || s[4] != '-') return 0;
  /* "^(%d%d?)%-(%d%d?)(.*)$" */
  p = one_or_two(p, end, '-', &m);
  if (p == NULL || p >= end || !is_digit((unsigned char)*p)) return 0;
  d = *p++ - '0';
  if (p < end && is_digit((unsigned char)*p)) d = d * 10 + (*p++ - '0');
  if (m < 1 || m > 12 || d < 1 || d > 31) return 0;
  if (p == end) return 1;
  /* "^([Tt ])(.*)$" */
  sep = *p++;
  if (sep != 'T' && sep != 't' && sep != ' ') return 0;
  /* "^(%d%d?):(%d%d?):(%d%d?)(.*)$" */
  p = one_or_two(p, end, ':', &hh);
  if (p != NULL) p = one_or_two(p, end, ':', &mm);
  if (p == NULL || p >= end || !is_digit((unsigned char)*p)) return 0;
  ss = *p++ - '0';
  if (p < end && is_digit((unsigned char)*p)) ss = ss * 10 + (*p++ - '0');
  if (hh > 23 || mm > 59 || ss > 59) return 0;
  /* zone:gsub("^%.%d+", "") */
  zone = p;
  if (zone + 1 < end && zone[0] == '.' && is_digit((unsigned char)zone[1])) {
    zone += 2;
    while (zone < end && is_digit((unsigned char)*zone)) zone++;
  }
  if (sep == ' ') return zone == end;
  if (end - zone == 1 && zone[0] == 'Z') return 1;
  /* "^[+-]%d%d:%d%d$" */
  return end - zone == 6 && (zone[0] == '+' || zone[0] == '-') && all_digits(zone + 1, zone + 3) &&
      zone[3] == ':' && all_digits(zone + 4, zone + 6);
}

static int all_in(const char *s, const char *end, const char *set) {
  if (s == end) return 0;
  for (; s < end; s++)
    if (*s == '\0' || strchr(set, *s) == NULL) return 0;
  return 1;
}

/* go_integer: strconv.ParseInt(s, 0, 64) would take it (s without "_") */
static int go_integer(const char *s, const char *end) {
  /* s:gsub("^[+-]", "") */
  if (s < end && (*s == '+' || *s == '-')) s++;
  if (end - s >= 2 && s[0] == '0') {
    if (s[1] == 'x' || s[1] == 'X') return all_in(s + 2, end, "0123456789abcdefABCDEF");
    if (s[1] == 'b' || s[1] == 'B') return all_in(s + 2, end, "01");
    if (s[1] == 'o' || s[1] == 'O') return all_in(s + 2, end, "01234567");
  }
  /* "^0[0-7]*$" or "^[1-9]%d*$" */
  if (s < end && s[0] == '0') return s + 1 == end || all_in(s + 1, end, "01234567");
  return s < end && s[0] >= '1' && s[0] <= '9' && (s + 1 == end || all_digits(s + 1, end));
}

/* "[eE][-+]?%d+$" from p */
static int exponent_at(const char *p, const char *end) {
  if (p >= end || (*p != 'e' && *p != 'E')) return 0;
  p++;
  if (p < end && (*p == '-' || *p == '+')) p++;
  return all_digits(p, end);
}

/* is_float: "^[-+]?%.%d+$", "^[-+]?%.%d+[eE][-+]?%d+$", "^[-+]?%d+%.?%d*$"
** or "^[-+]?%d+%.?%d*[eE][-+]?%d+$" */
static int is_float(const char *s, const char *end) {
  const char *p;
  if (s < end && (*s == '-' || *s == '+')) s++;
  if (s < end && *s == '.') {
    p = s + 1;
    if (p >= end || !is_digit((unsigned char)*p)) return 0;
    while (p < end && is_digit((unsigned char)*p)) p++;
    return p == end || exponent_at(p, end);
  }
  p = s;
  if (p >= end || !is_digit((unsigned char)*p)) return 0;
  while (p < end && is_digit((unsigned char)*p)) p++;
  if (p < end && *p == '.') p++;
  while (p < end && is_digit((unsigned char)*p)) p++;
  return p == end || exponent_at(p, end);
}

/* the base 60 check of plain_is_string: s (of [-+]?%d[%d_]*:...) reads as
** a number to old readers */
static int is_base60(const char *s, const char *end) {
  const char *p = s, *body, *last, *q;
  /* s:match("^[-+]?%d[%d_]*:") */
  if (p < end && (*p == '-' || *p == '+')) p++;
  if (p >= end || !is_digit((unsigned char)*p)) return 0;
  p++;
  while (p < end && (is_digit((unsigned char)*p) || *p == '_')) p++;
  if (p >= end || *p != ':') return 0;
  body = p;
  /* body:gsub("%.[%d_]*$", "") */
  last = end;
  for (q = end; q > body; q--) {
    if (q[-1] == '.') {
      last = q - 1;
      break;
    }
    if (!is_digit((unsigned char)q[-1]) && q[-1] != '_') break;
  }
  /* every part of body:gmatch(":([^:]*)") matches "^[0-5]?%d$" */
  p = body;
  while (p < last) {
    const char *part = p + 1, *stop = part;
    while (stop < last && *stop != ':') stop++;
    if (!((stop - part == 1 && is_digit((unsigned char)part[0])) ||
          (stop - part == 2 && part[0] >= '0' && part[0] <= '5' && is_digit((unsigned char)part[1]))))
      return 0;
    p = stop;
  }
  return 1;
}

/* RESERVED of yaml.lua (whole string) */
static const char *const reserved_other[] = {"",      "~",     ".nan",  ".NaN",  ".NAN",  ".inf",
                                             ".Inf",  ".INF",  "+.inf", "+.Inf", "+.INF", "-.inf",
                                             "-.Inf", "-.INF", "<<",    NULL};

static int is_reserved_any(const char *s, size_t len) {
  int i;
  if (is_reserved(s, len)) return 1;
  for (i = 0; reserved_other[i] != NULL; i++)
    if (strlen(reserved_other[i]) == len && memcmp(reserved_other[i], s, len) == 0) return 1;
  return 0;
}

/* plain_is_string: plain s reads back as the string s */
static int plain_is_string(const char *s, size_t len) {
  const char *end = s + len;
  char c;
  if (is_reserved_any(s, len)) return 0;
  c = s[0];
  if (is_digit((unsigned char)c) || c == '+' || c == '-') {
    char plain[256];
    size_t n = 0, i;
    if (is_timestamp(s, end)) return 0;
    if (len > sizeof plain) return -1; /* not decided here */
    for (i = 0; i < len; i++)
      if (s[i] != '_') plain[n++] = s[i];
    if (go_integer(plain, plain + n) || is_float(plain, plain + n)) return 0;
    /* plain:match("^%-?0b[01]+$") */
    i = plain[0] == '-' ? 1 : 0;
    if (n >= i + 3 && plain[i] == '0' && plain[i + 1] == 'b' && all_in(plain + i + 2, plain + n, "01"))
      return 0;
    if (memchr(s, ':', len) != NULL && is_base60(s, end)) return 0;
  } else if (c == '.') {
    if (is_float(s, end)) return 0;
  }
  return 1;
}

/* analyze_ascii's block_plain for a string without a line break: no
** leading or trailing space, no indicator where YAML would read one */
static int block_plain(const char *s, size_t len) {
  const char *end = s + len, *p;
  char first = s[0];
  if (first == ' ' || s[len - 1] == ' ') return 0;
  if (len >= 3 && (memcmp(s, "---", 3) == 0 || memcmp(s, "...", 3) == 0)) return 0;
  if (strchr("#,[]{}&*!|>'\"%@`", first) != NULL) return 0;
  /* "^[%?:%-] " and s == "?", ":" or "-" */
  if ((first == '?' || first == ':' || first == '-') && (len == 1 || s[1] == ' ')) return 0;
  /* ".: ", a ":" at the end, "[ \n]#" */
  for (p = s + 1; p + 1 < end; p++)
    if (p[0] == ':' && p[1] == ' ') return 0;
  if (len > 1 && s[len - 1] == ':') return 0;
  for (p = s; p + 1 < end; p++)
    if (p[0] == ' ' && p[1] == '#') return 0;
  return 1;
}

/* folder's state: lines are the emitter's line, folded at `indent` */
static void fold(Emitter *e, int indent, size_t *column) {
  put_line(e);
  line_reset(e);
  line_spaces(e, (size_t)indent);
  *column = (size_t)indent;
}

/* write_plain and write_single (quote 1) of an ASCII string */
static void write_spaced(Emitter *e, const char *s, size_t len, int indent, int quote) {
  size_t column = e->line->len, i = 0;
  int spaces = 0;
  if (quote) {
    line_add(e, "'", 1);
    column++;
  }
  while (i < len) {
    if (s[i] == ' ') {
      if (!spaces && column > WIDTH && (!quote || (i > 0 && i + 1 < len)) &&
          (i + 1 >= len || s[i + 1] != ' ')) {
        fold(e, indent, &column);
      } else {
        line_add(e, " ", 1);
        column++;
      }
      spaces = 1;
      i++;
    } else {
      const char *sp = (const char *)memchr(s + i, ' ', len - i);
      size_t j = sp != NULL ? (size_t)(sp - s) : len, k;
      for (k = i; k < j; k++) {
        if (quote && s[k] == '\'') {
          line_add(e, "''", 2);
          column += 2;
        } else {
          line_add(e, s + k, 1);
          column++;
        }
      }
      spaces = 0;
      i = j;
    }
  }
  if (quote) line_add(e, "'", 1);
}

/* write_double of an ASCII string */
static void write_double(Emitter *e, const char *s, size_t len, int indent) {
  size_t column = e->line->len, i;
  int spaces = 0;
  line_add(e, "\"", 1);
  column++;
  for (i = 0; i < len; i++) {
    char c = s[i];
    if (c == '"' || c == '\\') {
      line_add(e, "\\", 1);
      line_add(e, &c, 1);
      column += 2;
      spaces = 0;
    } else if (c == ' ') {
      if (!spaces && column > WIDTH && i > 0 && i + 1 < len) {
        fold(e, indent, &column);
        if (s[i + 1] == ' ') {
          line_add(e, "\\", 1);
          column++;
        }
      } else {
        line_add(e, " ", 1);
        column++;
      }
      spaces = 1;
    } else {
      line_add(e, &c, 1);
      column++;
      spaces = 0;
    }
  }
  line_add(e, "\"", 1);
}

/* A string of printable ASCII without a line break after an ASCII line, as
** yaml.lua's scalar writes it; 0 when this cannot tell (left to it). */
static int ascii_string(Emitter *e, const char *s, size_t len, int indent) {
  size_t i;
  int plain;
  for (i = 0; i < len; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7E) return 0;
  for (i = 0; i < e->line->len; i++)
    if ((unsigned char)e->line->buf[i] >= 0x80) return 0;
  if (len == 0) {
    line_add(e, "\"\"", 2);
    return 1;
  }
  plain = plain_is_string(s, len);
  if (plain < 0) return 0;
  if (!plain) write_double(e, s, len, indent);
  else if (block_plain(s, len)) write_spaced(e, s, len, indent, 0);
  else write_spaced(e, s, len, indent, 1);
  return 1;
}

/* The scalar at idx after the line built so far (yaml.lua's scalar(out,
** first, v, indent)). */
static void scalar(Emitter *e, int idx, int indent) {
  lua_State *L = e->L;
  char num[64];
  int t = lua_type(L, idx);
  if (t == LUA_TNIL || (t == LUA_TLIGHTUSERDATA && lua_touserdata(L, idx) == NULL)) {
    line_add(e, "null", 4);
  } else if (t == LUA_TBOOLEAN) {
    if (lua_toboolean(L, idx)) line_add(e, "true", 4);
    else line_add(e, "false", 5);
  } else if (t == LUA_TNUMBER && lua_isinteger(L, idx)) {
    line_add(e, num, (size_t)snprintf(num, sizeof num, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx)));
  } else if (t == LUA_TNUMBER && lua_tonumber(L, idx) == floor(lua_tonumber(L, idx)) &&
             fabs(lua_tonumber(L, idx)) < 9223372036854775808.0) {
    /* an integral float JSON writes without a fraction reads back as an integer */
    lua_Integer i = (lua_Integer)lua_tonumber(L, idx);
    line_add(e, num, (size_t)snprintf(num, sizeof num, LUA_INTEGER_FMT, (LUAI_UACINT)i));
  } else {
    size_t len = 0;
    const char *s = t == LUA_TSTRING ? lua_tolstring(L, idx, &len) : NULL;
    if (s != NULL && is_simple_plain(s, len) && e->line->len + len <= WIDTH) {
      line_add(e, s, len);
    } else if (s == NULL || !ascii_string(e, s, len, indent)) {
      luaL_checkstack(L, 6, "cozy.yaml: nested too deep");
      lua_pushvalue(L, SCALAR);
      lua_pushvalue(L, OUT);
      lua_pushlstring(L, e->line->buf, e->line->len);
      lua_pushvalue(L, idx);
      lua_pushinteger(L, indent);
      call_writer(e, 4);
      return;
    }
  }
  put_line(e);
}

/* A key of a mapping sorted here: its bytes and where they are. */
typedef struct Key {
  const char *s;
  size_t len;
} Key;

/* How the keys of a mapping are sorted here. */
typedef enum {
  KEYS_BY_LUA, /* a key that is no string or not ASCII, or too many keys with digits */
  KEYS_BY_BYTES, /* strings of ASCII without digits */
  KEYS_BY_DIGITS, /* strings of ASCII, some with digits: Lua's table.sort with key_less */
} KeyOrder;

/* Lua's table.sort randomizes its pivots from this size on, where a
** comparison that is not a strict order would make its result change */
#define LUA_SORT_RANLIMIT 100

/* How the keys of the mapping at idx can be sorted; their count in *count. */
static KeyOrder key_order(lua_State *L, int idx, size_t *count) {
  size_t n = 0;
  int digits = 0;
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    size_t len, i;
    const char *s;
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING) {
      lua_pop(L, 1);
      return KEYS_BY_LUA;
    }
    s = lua_tolstring(L, -1, &len);
    for (i = 0; i < len; i++) {
      unsigned char c = (unsigned char)s[i];
      if (c >= 0x80) {
        lua_pop(L, 1);
        return KEYS_BY_LUA;
      }
      if (is_digit(c)) digits = 1;
    }
    n++;
  }
  *count = n;
  if (!digits) return KEYS_BY_BYTES;
  return n <= LUA_SORT_RANLIMIT ? KEYS_BY_DIGITS : KEYS_BY_LUA;
}

/* yaml.lua's order of two keys without digits or non-ASCII bytes: at the
** first byte that differs a letter goes after any other byte, else the
** byte order decides; a prefix goes first. */
static int key_cmp(const void *va, const void *vb) {
  const Key *a = (const Key *)va, *b = (const Key *)vb;
  size_t n = a->len < b->len ? a->len : b->len, i;
  for (i = 0; i < n; i++) {
    unsigned char x = (unsigned char)a->s[i], y = (unsigned char)b->s[i];
    if (x != y) {
      unsigned xr = is_letter(x) ? x + 0x80u : x, yr = is_letter(y) ? y + 0x80u : y;
      return xr < yr ? -1 : 1;
    }
  }
  return (a->len > b->len) - (a->len < b->len);
}

/* yaml.lua's full_key_less (go-yaml's keyList.Less) on two ASCII keys: at
** the first byte that differs, runs of digits compare by value. Lua's
** integers wrap around; so do these. */
static int key_less(const Key *a, const Key *b) {
  size_t n = a->len < b->len ? a->len : b->len, i;
  const unsigned char *ar = (const unsigned char *)a->s, *br = (const unsigned char *)b->s;
  for (i = 0; i < n; i++) {
    unsigned char x = ar[i], y = br[i];
    if (x != y) {
      int al = is_letter(x), bl = is_letter(y);
      uint64_t an = 0, bn = 0;
      size_t ai = i, bi = i, j;
      if (al && bl) return x < y;
      if (al || bl) return bl;
      if (x == '0' || y == '0') {
        for (j = i; j > 0; j--) {
          if (!is_digit(ar[j - 1])) break;
          if (ar[j - 1] != '0') {
            an = bn = 1;
            break;
          }
        }
      }
      while (ai < a->len && is_digit(ar[ai])) an = an * 10 + (uint64_t)(ar[ai++] - '0');
      while (bi < b->len && is_digit(br[bi])) bn = bn * 10 + (uint64_t)(br[bi++] - '0');
      if (an != bn) return (int64_t)an < (int64_t)bn;
      if (ai != bi) return ai < bi;
      return x < y;
    }
  }
  return a->len < b->len;
}

static void swap_keys(Key *k, size_t i, size_t j) {
  Key t = k[i];
  k[i] = k[j];
  k[j] = t;
}

/* Lua 5.4's table.sort (ltablib.c's auxsort and partition, without
** their randomized pivots, which it uses on LUA_SORT_RANLIMIT elements or
** more only) with key_less, on k[1 .. n] (k[0] unused): the same
** comparisons and swaps, so the same order as yaml.lua's sort, even for
** keys go-yaml's comparison would not order consistently. 0 where Lua
** would raise "invalid order function for sorting" (left to it). */
static int lua_sort_keys(Key *k, size_t lo, size_t up) {
  while (lo < up) {
    size_t p, i, j, n;
    Key pivot;
    if (key_less(&k[up], &k[lo])) swap_keys(k, lo, up);
    if (up - lo == 1) return 1;
    p = (lo + up) / 2;
    if (key_less(&k[p], &k[lo])) swap_keys(k, p, lo);
    else if (key_less(&k[up], &k[p])) swap_keys(k, p, up);
    if (up - lo == 2) return 1;
    pivot = k[p];
    swap_keys(k, p, up - 1);
    /* partition: a[lo .. i - 1] <= a[i] == pivot <= a[i + 1 .. up] */
    i = lo;
    j = up - 1;
    for (;;) {
      while (key_less(&k[++i], &pivot))
        if (i == up - 1) return 0;
      while (key_less(&pivot, &k[--j]))
        if (j < i) return 0;
      if (j < i) {
        swap_keys(k, up - 1, i);
        break;
      }
      swap_keys(k, i, j);
    }
    p = i;
    if (p - lo < up - p) {
      if (!lua_sort_keys(k, lo, p - 1)) return 0;
      n = p - lo;
      lo = p + 1;
    } else {
      if (!lua_sort_keys(k, p + 1, up)) return 0;
      n = up - p;
      up = p - 1;
    }
    (void)n; /* (Lua randomizes its pivots here after an imbalance, from RANLIMIT) */
  }
  return 1;
}

static void emit(Emitter *e, int v, int indent, int lead, int depth);

/* The value at the top of the stack, under the key whose line so far is
** in the line (pad, key, ":"); popped. */
static void map_value(Emitter *e, int indent, int depth) {
  lua_State *L = e->L;
  int val = lua_gettop(L);
  Kind vk = kind_of(L, val);
  if (vk == KIND_SCALAR) {
    line_add(e, " ", 1);
    scalar(e, val, indent + INDENT);
  } else if (is_empty(L, val)) {
    line_add(e, vk == KIND_SEQ ? " []" : " {}", 3);
    put_line(e);
  } else {
    put_line(e);
    /* a sequence under a key is not indented */
    emit(e, val, vk == KIND_SEQ ? indent : indent + INDENT, 0, depth + 1);
  }
  lua_settop(L, val - 1);
}

/* One entry of a mapping: key (a string at index key) and its value at the
** top of the stack; first_pad (a string at index lead, or the pad) begins
** the first entry's line. */
static void map_entry(Emitter *e, int key, int first, int lead, int indent, int depth) {
  lua_State *L = e->L;
  size_t klen, llen = 0;
  const char *k = lua_tolstring(L, key, &klen);
  const char *l = lead != 0 ? lua_tolstring(L, lead, &llen) : NULL;
  line_reset(e);
  if (first && l != NULL) line_add(e, l, llen);
  else line_spaces(e, (size_t)indent);
  if (memchr(k, '\n', klen) != NULL || klen > MAX_SIMPLE_KEY) {
    /* not a simple key (go-yaml's check_simple_key): "? key" then ": value" */
    luaL_checkstack(L, 6, "cozy.yaml: nested too deep");
    line_add(e, "? ", 2);
    lua_pushvalue(L, SCALAR);
    lua_pushvalue(L, OUT);
    lua_pushlstring(L, e->line->buf, e->line->len);
    lua_pushvalue(L, key);
    lua_pushinteger(L, indent + INDENT);
    call_writer(e, 4);
    line_reset(e);
    line_spaces(e, (size_t)indent);
  } else if (is_simple_plain(k, klen) && klen <= WIDTH) {
    line_add(e, k, klen);
  } else {
    size_t tlen;
    const char *text;
    luaL_checkstack(L, 3, "cozy.yaml: nested too deep");
    lua_pushvalue(L, KEY_TEXT);
    lua_pushvalue(L, key);
    lua_call(L, 1, 1);
    text = lua_tolstring(L, -1, &tlen);
    if (text == NULL) luaL_error(L, "cozy.yaml: key_text gave no string");
    if (memchr(text, '\n', tlen) != NULL) e->has_break = 1; /* (a quoted key never holds one) */
    line_add(e, text, tlen);
    lua_pop(L, 1);
  }
  line_add(e, ":", 1);
  map_value(e, indent, depth);
}

/* t[k], and t[tonumber(k)] when that is nil (yaml.lua's get), of the table
** at t and the key string at k: pushed. */
static void get(lua_State *L, int t, int k) {
  size_t len;
  const char *s = lua_tolstring(L, k, &len);
  lua_pushvalue(L, k);
  if (lua_gettable(L, t) != LUA_TNIL) return;
  lua_pop(L, 1);
  if (lua_stringtonumber(L, s) == len + 1) {
    lua_gettable(L, t);
  } else {
    lua_pushnil(L);
  }
}

/* The entries of the mapping at v in the keys' order k[0 .. count - 1]. */
static void map_entries(Emitter *e, int v, const Key *keys, size_t count, int indent, int lead, int depth) {
  lua_State *L = e->L;
  size_t i;
  luaL_checkstack(L, 8, "cozy.yaml: nested too deep");
  for (i = 0; i < count; i++) {
    int key;
    lua_pushlstring(L, keys[i].s, keys[i].len);
    key = lua_gettop(L);
    lua_pushvalue(L, key);
    lua_gettable(L, v);
    map_entry(e, key, i == 0, lead, indent, depth);
    lua_settop(L, key - 1);
  }
}

static void emit_map(Emitter *e, int v, int indent, int lead, int depth) {
  lua_State *L = e->L;
  size_t count = 0, i;
  KeyOrder order = key_order(L, v, &count);
  if (order != KEYS_BY_LUA) {
    Key *keys;
    int base = lua_gettop(L);
    /* the keys stay reachable from v, which nothing changes meanwhile;
    ** keys[0] is lua_sort_keys's unused slot */
    keys = (Key *)lua_newuserdatauv(L, (count + 1) * sizeof *keys, 0);
    i = 1;
    lua_pushnil(L);
    while (lua_next(L, v) != 0) {
      lua_pop(L, 1);
      keys[i].s = lua_tolstring(L, -1, &keys[i].len);
      i++;
    }
    if (order == KEYS_BY_BYTES) {
      qsort(keys + 1, count, sizeof *keys, key_cmp);
    } else if (count > 1 && !lua_sort_keys(keys, 1, count)) {
      order = KEYS_BY_LUA;
    }
    if (order != KEYS_BY_LUA) map_entries(e, v, keys + 1, count, indent, lead, depth);
    lua_settop(L, base);
  }
  if (order == KEYS_BY_LUA) {
    int keys;
    lua_Integer j, n;
    luaL_checkstack(L, 8, "cozy.yaml: nested too deep");
    lua_pushvalue(L, SORTED_KEYS);
    lua_pushvalue(L, v);
    lua_call(L, 1, 1);
    keys = lua_gettop(L);
    n = (lua_Integer)lua_rawlen(L, keys);
    for (j = 1; j <= n; j++) {
      int key;
      lua_rawgeti(L, keys, j);
      key = lua_gettop(L);
      if (lua_type(L, key) != LUA_TSTRING)
        luaL_error(L, "cozy.yaml: sorted_keys gave a key that is no string");
      get(L, v, key);
      map_entry(e, key, j == 1, lead, indent, depth);
      lua_settop(L, keys);
    }
    lua_settop(L, keys - 1);
  }
}

static void emit_seq(Emitter *e, int v, int indent, int lead, int depth) {
  lua_State *L = e->L;
  lua_Integer i;
  luaL_checkstack(L, 8, "cozy.yaml: nested too deep");
  for (i = 1;; i++) {
    int item = lua_gettop(L) + 1;
    size_t llen;
    const char *l;
    Kind ik;
    if (lua_geti(L, v, i) == LUA_TNIL) {
      lua_pop(L, 1);
      break;
    }
    line_reset(e);
    if (i == 1 && lead != 0) {
      l = lua_tolstring(L, lead, &llen);
      line_add(e, l, llen);
    } else {
      line_spaces(e, (size_t)indent);
    }
    line_add(e, "- ", 2);
    ik = kind_of(L, item);
    if (ik == KIND_SCALAR) {
      scalar(e, item, indent + INDENT);
    } else if (is_empty(L, item)) {
      line_add(e, ik == KIND_SEQ ? "[]" : "{}", 2);
      put_line(e);
    } else {
      int p;
      lua_pushlstring(L, e->line->buf, e->line->len);
      p = lua_gettop(L);
      emit(e, item, indent + INDENT, p, depth + 1);
    }
    lua_settop(L, item - 1);
  }
}

/* The lines the memo holds of the table at v emitted at indent, no
** deeper than depth (so never past the depth limit where it was not),
** appended to out; returns whether it held them. */
static int memo_replay(Emitter *e, int v, int indent, int depth) {
  lua_State *L = e->L;
  const MemoRecord *r;
  lua_Integer i;
  luaL_checkstack(L, 4, "cozy.yaml: nested too deep");
  lua_pushvalue(L, v);
  if (lua_rawget(L, e->seen) != LUA_TNUMBER) {
    lua_pop(L, 1);
    return 0;
  }
  r = &e->memo->r[lua_tointeger(L, -1) - 1];
  lua_pop(L, 1);
  if (r->indent != indent || depth > r->depth) return 0;
  lua_rawgeti(L, e->outs, r->out_no);
  for (i = r->first; i <= r->last; i++) {
    lua_rawgeti(L, -1, i);
    lua_rawseti(L, OUT, ++e->n);
  }
  lua_pop(L, 1);
  if (r->has_break) e->has_break = 1;
  return 1;
}

/* Records that the table at v, emitted at indent and depth, is out's lines
** first .. e->n, has_break saying whether one of them holds a line break. */
static void memo_record(Emitter *e, int v, lua_Integer first, int indent, int depth) {
  lua_State *L = e->L;
  Memo *m = e->memo;
  MemoRecord *r;
  if (m->n == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    MemoRecord *grown = (MemoRecord *)realloc(m->r, cap * sizeof *grown);
    if (grown == NULL) luaL_error(L, "cozy.yaml: out of memory for the memo");
    m->r = grown;
    m->cap = cap;
  }
  r = &m->r[m->n++];
  r->first = first;
  r->last = e->n;
  r->out_no = e->out_no;
  r->indent = indent;
  r->depth = depth;
  r->has_break = e->has_break;
  lua_pushvalue(L, v);
  lua_pushinteger(L, (lua_Integer)m->n);
  lua_rawset(L, e->seen);
}

/* yaml.lua's emit: v (a mapping or a sequence) at `indent`, its first line
** begun by the string at index lead instead of the indentation when lead is
** not 0. With a memo, a table emitted with no lead is looked up and
** recorded (one begun by a lead, the first item of a sequence, is not:
** its first line is the lead's, and its own mappings and sequences are
** recorded anyway). */
static void emit(Emitter *e, int v, int indent, int lead, int depth) {
  lua_State *L = e->L;
  lua_Integer first = e->n + 1;
  int outer_break = e->has_break, memo = e->memo != NULL && lead == 0;
  if (depth > COZY_JSON_MAX_DEPTH) {
    lua_pushstring(L, "cozy.yaml: a table nested deeper than " COZY_JSON_STR(COZY_JSON_MAX_DEPTH) " levels");
    lua_error(L);
  }
  if (memo) {
    if (memo_replay(e, v, indent, depth)) return;
    e->has_break = 0; /* this table's own, for its record */
  }
  if (kind_of(L, v) == KIND_MAP) emit_map(e, v, indent, lead, depth);
  else emit_seq(e, v, indent, lead, depth);
  if (memo) {
    memo_record(e, v, first, indent, depth);
    e->has_break |= outer_break;
  }
}

/* emit(out, v, scalar, key_text, sorted_keys [, memo]) -> whether a line
** holds a line break */
static int yaml_emit(lua_State *L) {
  Emitter e;
  luaL_checktype(L, OUT, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, SCALAR, LUA_TFUNCTION);
  luaL_checktype(L, KEY_TEXT, LUA_TFUNCTION);
  luaL_checktype(L, SORTED_KEYS, LUA_TFUNCTION);
  e.memo = lua_isnoneornil(L, 6) ? NULL : (Memo *)luaL_checkudata(L, 6, MEMO_MT);
  lua_settop(L, 6);
  e.seen = e.outs = e.out_no = 0;
  if (e.memo != NULL) {
    lua_getiuservalue(L, 6, 1);
    e.seen = lua_gettop(L);
    lua_getiuservalue(L, 6, 2);
    e.outs = lua_gettop(L);
    e.out_no = (int)lua_rawlen(L, e.outs) + 1;
    lua_pushvalue(L, OUT);
    lua_rawseti(L, e.outs, e.out_no);
  }
  e.L = L;
  e.line = cozy_json_push_scratch(L);
  cozy_json_text_room(L, e.line, 256); /* a buffer from the start: no copy to or from NULL */
  e.n = (lua_Integer)lua_rawlen(L, OUT);
  e.has_break = 0;
  emit(&e, 2, 0, 0, 0);
  lua_pushboolean(L, e.has_break);
  return 1;
}

static int memo_gc(lua_State *L) {
  Memo *m = (Memo *)luaL_checkudata(L, 1, MEMO_MT);
  free(m->r);
  memset(m, 0, sizeof *m);
  return 0;
}

/* memo() -> a new memo for emit */
static int yaml_memo(lua_State *L) {
  Memo *m = (Memo *)lua_newuserdatauv(L, sizeof *m, 2);
  memset(m, 0, sizeof *m);
  if (luaL_newmetatable(L, MEMO_MT)) {
    lua_pushcfunction(L, memo_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 2);
  return 1;
}

int luaopen_cozy_yaml_emitter(lua_State *L) {
  static const luaL_Reg funcs[] = {{"emit", yaml_emit}, {"memo", yaml_memo}, {NULL, NULL}};
  luaL_newlibtable(L, funcs);
  luaL_requiref(L, "cozy.json", luaopen_cozy_json, 0);
  lua_getfield(L, -1, "array_mt");
  lua_getfield(L, -2, "object_mt");
  lua_remove(L, -3);
  luaL_setfuncs(L, funcs, 2);
  return 1;
}
