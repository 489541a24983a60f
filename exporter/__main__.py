from exporter.entry import main

raise SystemExit(main())
