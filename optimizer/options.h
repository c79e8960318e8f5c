/* optimizer/options.h: checking the options of an optimizer type (internal to optimizer/;
 * implemented in optimizer.c). */
#ifndef NAS_OPTIMIZER_OPTIONS_H
#define NAS_OPTIMIZER_OPTIONS_H

#include <jansson.h>

#include "common/common.h"

/* Fails on the first key of options (a JSON object) that is not in known (a
 * NULL-terminated list; NULL when the type takes no options), naming the key and the
 * optimizer type and suggesting the nearest known key. */
int optimizer_check_options(const char *type, const json_t *options, const char *const *known,
                            nas_err *err);

#endif
