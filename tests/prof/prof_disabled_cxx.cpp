// The disabled-build test compiled as C++.
#include "prof_disabled.c"
