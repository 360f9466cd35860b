/*
** libFuzzer target: the parts of the transport that parse what a server
** sends (core/transport_http.c): the header callback (Retry-After, Warning,
** status lines) and the body callback with its max_response_bytes limit.
** Input: byte 0 and 1 pick the limit; then header lines up to an empty
** line, handed over one line at a time as libcurl does; the rest is the
** body, handed over in pieces whose sizes come from the input too.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct cozy_response t;
  size_t i = 0, total = 0;
  if (size < 2) return 0;
  memset(&t, 0, sizeof t);
  t.retry_after = -1;
  t.max_response_bytes = 1 + (((size_t)data[0] << 8) | data[1]);
  i = 2;
  /* header lines, each ending in '\n' (the last may not) */
  while (i < size) {
    size_t j = i;
    char *line;
    while (j < size && data[j] != '\n') j++;
    if (j < size) j++;
    if (j - i <= 2 && (data[i] == '\n' || data[i] == '\r')) {
      i = j;
      break;
    } /* end of headers */
    line = malloc(j - i); /* exactly the line: ASan sees any read past it */
    if (line == NULL) abort();
    memcpy(line, data + i, j - i);
    if (cozy_http_on_header(line, 1, j - i, &t) != j - i) abort();
    free(line);
    if (t.warnings_len >= sizeof t.warnings || t.warnings[t.warnings_len] != '\0') abort();
    if (!(t.retry_after == -1 || t.retry_after >= 0)) abort();
    i = j;
  }
  /* the body, in pieces of 1..256 bytes (the first byte of each says how long) */
  while (i < size) {
    size_t n = 1 + data[i], got;
    char *piece;
    i++;
    if (n > size - i) n = size - i;
    if (n == 0) break;
    piece = malloc(n);
    if (piece == NULL) abort();
    memcpy(piece, data + i, n);
    got = cozy_http_on_body(piece, 1, n, &t);
    free(piece);
    i += n;
    if (got == n) {
      total += n;
      if (t.body_too_large || t.body_len != total || t.body[t.body_len] != '\0') abort();
    } else {
      /* refused: only because the limit would be passed, and nothing kept past it */
      if (got != 0 || !t.body_too_large || total + n <= t.max_response_bytes) abort();
      break;
    }
    if (t.body_len > t.max_response_bytes || t.body_cap > t.max_response_bytes + 1) abort();
  }
  free(t.body);
  return 0;
}
