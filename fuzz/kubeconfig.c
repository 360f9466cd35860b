/*
** libFuzzer target: the kubeconfig reader (core/kubeconfig.c: bounded file
** read, YAML depth check, libyaml document walk, base64 of the -data
** fields). The input is written to a file and loaded as --kubeconfig would
** be. Either it loads, or it fails with a message; nothing crashes, leaks
** or reads out of bounds, and a failure never leaves anything to free.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kubeconfig.h"

static char path[256];

static void setup(void) {
  char dir[] = "/tmp/cozy-fuzz-kubeconfig.XXXXXX";
  if (mkdtemp(dir) == NULL) abort();
  snprintf(path, sizeof path, "%s/kubeconfig", dir);
  /* only the file given is read: no environment fallback */
  unsetenv("KUBECONFIG");
  unsetenv("KUBERNETES_SERVICE_HOST");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct cozy_kubeconfig kc;
  struct cozy_config_error err;
  FILE *f;
  if (path[0] == '\0') setup();
  f = fopen(path, "wb");
  if (f == NULL) abort();
  if (size > 0 && fwrite(data, 1, size, f) != size) abort();
  if (fclose(f) != 0) abort();
  if (cozy_kubeconfig_load(path, NULL, &kc, &err) == 0) {
    /* a loaded configuration has a server URL and a source */
    if (kc.server == NULL || kc.source == NULL) abort();
    if (strncmp(kc.server, "http://", 7) != 0 && strncmp(kc.server, "https://", 8) != 0) abort();
    if (kc.token.data != NULL && cozy_token_invalid(&kc.token)) abort();
    cozy_kubeconfig_free(&kc);
  } else {
    /* a failure says why, and left nothing allocated */
    if (err.message[0] == '\0') abort();
    if (memchr(err.message, '\0', sizeof err.message) == NULL) abort();
    if (kc.server != NULL || kc.token.data != NULL || kc.source != NULL) abort();
  }
  return 0;
}
