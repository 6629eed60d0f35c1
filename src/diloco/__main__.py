from diloco.tools.cli import main

raise SystemExit(main())
