/* The kubeconfig a legacy script gets (core/kubeconfig_write.c): the one
** cluster, user and namespace the engine uses, nothing else. */
#ifndef COZY_KUBECONFIG_WRITE_H
#define COZY_KUBECONFIG_WRITE_H

#include <stddef.h>

struct cozy_kubeconfig;

/* Writes DIR/config (created, mode 0600; DIR exists and is private) with
** one cluster, one user and one context, the current one, of kc, whose
** namespace is ns. path receives DIR/config. Returns 0, or -1 with a
** one-line message in err (no secret in it) and no file left. */
int cozy_kubeconfig_write(const struct cozy_kubeconfig *kc, const char *ns, const char *dir, char *path,
                          size_t pathlen, char *err, size_t errlen);

#endif
