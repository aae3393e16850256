// filled in by the charts slice
