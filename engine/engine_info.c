/* Engine build information. */
#include "e8kv.h"

const char *e8kv_engine_version(void);
const char *e8kv_engine_version(void) { return e8kv_version_string(); }
