/*
** cozy.proc's pieces that another child-starting file needs: the exec
** credential plugin runner (exec_credential.c) starts its child as a legacy
** script is started.
*/
#ifndef COZY_PROC_H
#define COZY_PROC_H

/* Every descriptor from `from` up is closed (close_range, else one by one
** up to the limit). Async-signal-safe: for a child between fork and exec. */
void cozy_close_from(int from);

#endif
