module respawn.invalid/pause

go 1.24
