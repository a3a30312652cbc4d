from framerelay.cli import main

raise SystemExit(main())
